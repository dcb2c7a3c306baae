"""kvcm.Client: the three lookups of the kvcm client library over its C ABI.

Each lookup makes one C call (blocking, the GIL released) and returns a `Locations`
sequence over the C result: its length needs no decoding (how many blocks matched); the
first access to a location decodes the whole result in one pass from a single flat view
(kvcm_flat_view): a constant number of ctypes calls whatever the number of locations, and
one copy of the strings. The C result is freed then, or when the sequence is dropped.
"""

import threading
from collections.abc import Sequence
from ctypes import byref, c_uint64, c_void_p, string_at
from itertools import islice, repeat
from typing import List, NamedTuple, Tuple

from . import _keys
from ._connected import Connected, raise_error
from ._lib import LIB, FastPathMetrics, FlatView


class Location(NamedTuple):
    """One block's location: storage type, spec size and its specs as (name, uri)."""

    type: int
    spec_size: int
    specs: List[Tuple[str, str]]


class Metrics(NamedTuple):
    """The fast path's counters (a snapshot)."""

    hits: int
    fallbacks: int
    retries: int
    extra_round_trips: int
    reconnects: int


def _strings(view, total):
    """The 2 * total names and URIs of a view, in order."""
    if not total:
        return []
    # Every string is followed by a NUL: one decode and one split, unless a string holds a
    # NUL itself (then the offsets say where each one ends).
    heap = string_at(view.strings, view.strings_len - 1).decode("utf-8")
    strings = heap.split("\0")
    if len(strings) == 2 * total:
        return strings
    offsets = view.string_offsets[: 2 * total + 1]
    raw = string_at(view.strings, view.strings_len)
    return [raw[a : b - 1].decode("utf-8") for a, b in zip(offsets, offsets[1:])]


_new_location = tuple.__new__


def _decode(result):
    """The locations of a result, in one pass over its flat view."""
    view = FlatView()
    if LIB.kvcm_locations_view(result, byref(view)):
        raise RuntimeError("kvcm_locations_view refused a live result")
    return _locations(view)


# Held while a result is decoded and freed: ctypes releases the GIL in every call, so two
# threads reading a fresh `Locations` at once would otherwise decode memory the other frees
# (and free it twice).
_DECODING = threading.Lock()


def _locations(view):
    """The locations a flat view describes."""
    count = view.count
    if not count:
        return []
    names_and_uris = iter(_strings(view, view.spec_total))
    specs = list(zip(names_and_uris, names_and_uris))
    starts = view.spec_starts[: count + 1]
    groups = map(specs.__getitem__, map(slice, starts, islice(starts, 1, None)))
    rows = zip(view.types[:count], view.spec_sizes[:count], groups)
    # tuple.__new__ builds each Location in C (Location(...) would run a Python frame each).
    return list(map(_new_location, repeat(Location), rows))


class Locations(Sequence):
    """The locations of one lookup (a read-only sequence of `Location`), decoded on first
    access to a location; `len()` reads only the count. Compares equal to a list of the
    same locations."""

    __slots__ = ("_result", "_count", "_decoded")

    def __init__(self, result):
        self._result = result
        self._count = LIB.kvcm_locations_count(result)
        self._decoded = None

    def _items(self):
        decoded = self._decoded
        if decoded is not None:
            return decoded
        with _DECODING:
            if self._decoded is None:
                # A decode that fails keeps the result: the next access tries again, and
                # `__del__` frees it.
                self._decoded = _decode(self._result)
                result, self._result = self._result, None
                LIB.kvcm_locations_free(result)
        return self._decoded

    def __len__(self):
        return self._count

    def __getitem__(self, index):
        return self._items()[index]

    def __iter__(self):
        return iter(self._items())

    def __eq__(self, other):
        if isinstance(other, (list, tuple, Locations)):
            return self._items() == list(other)
        return NotImplemented

    def __repr__(self):
        return f"Locations({self._items()!r})"

    def __del__(self):
        # No other thread holds the object any more: no lock (which may be gone while the
        # interpreter shuts down).
        result, self._result = getattr(self, "_result", None), None
        if result is not None and LIB is not None:
            LIB.kvcm_locations_free(result)


class Client(Connected):
    """A connected kvcm client for one instance.

    grpc: "http://host:port" of the gRPC service; http: "ip:port" of the meta HTTP listener
    (both may be comma-separated lists for failover); wire: "soft-tcp", "soft-shm",
    "verbs" (a library built with feature rdma) or "none"/None (every lookup over gRPC); api_key: the API key every call carries, for servers
    with kvcm.auth.meta = required (a refused key raises UnauthorizedError).
    TLS (servers with kvcm.tls.*): tls_ca, the path of the PEM CA the servers' certificates
    chain to, turns it on ("host:port" endpoints then mean https://; an http:// one is
    refused); tls_cert and tls_key (both or neither), the client certificate and key for
    mutual TLS; tls_server_name, the name the servers' certificates carry (default
    "localhost"). Unreadable files or a certificate without its key raise
    InvalidArgumentError naming the field. Connecting does not fail when the servers are down
    (or refuse the TLS handshake); lookups then raise UnreachableError. One client may
    be shared by threads (calls serialise); use one per thread for parallel lookups. Do not
    close it while a call on it is in flight.
    """

    _connect = LIB.kvcm_client_connect_tls
    _free = LIB.kvcm_client_free

    def _lookup(self, function, keys, *extra):
        handle = self._handle
        if handle is None:
            raise ValueError("kvcm client is closed")
        address, count, keep = _keys.pointer(keys)
        result, message = c_void_p(), c_void_p()
        status = function(handle, address, count, *extra, byref(result), byref(message))
        del keep  # the keys stayed exported until the call returned
        if status:
            raise_error(status, message)
        return Locations(result)

    def prefix_match(self, keys) -> "Locations":
        """Locations of the longest cached prefix of `keys` (int64 block keys)."""
        return self._lookup(LIB.kvcm_prefix_match, keys)

    def batch_get(self, keys) -> "Locations":
        """One location per key (an empty URI where a key is not cached)."""
        return self._lookup(LIB.kvcm_batch_get, keys)

    def sliding_window(self, keys, sw_size) -> "Locations":
        """Reverse rolling sliding-window match with a window of `sw_size` blocks."""
        if not isinstance(sw_size, int):
            raise TypeError(f"sw_size must be an int, not {type(sw_size).__name__}")
        if not -(1 << 31) <= sw_size < 1 << 31:
            raise OverflowError(f"sw_size {sw_size} does not fit in int32")
        return self._lookup(LIB.kvcm_sliding_window, keys, sw_size)

    def metrics(self) -> Metrics:
        """The fast path's counters."""
        if self._handle is None:
            raise ValueError("kvcm client is closed")
        out = FastPathMetrics()
        LIB.kvcm_client_metrics(self._handle, byref(out))
        return Metrics(out.hits, out.fallbacks, out.retries, out.extra_round_trips, out.reconnects)

    def set_read_reports(self, on: bool) -> None:
        """Reports the lookups the fast path answers to the server (off by default), so that
        its reclaimer, event log and capacity curves count them as reads."""
        if self._handle is None:
            raise ValueError("kvcm client is closed")
        LIB.kvcm_client_set_read_reports(self._handle, 1 if on else 0)

    def flush_read_reports(self) -> Tuple[int, int]:
        """Reports the lookups not reported yet; returns (reported, unreported) so far."""
        if self._handle is None:
            raise ValueError("kvcm client is closed")
        reported, unreported = c_uint64(), c_uint64()
        LIB.kvcm_client_flush_read_reports(self._handle, byref(reported), byref(unreported))
        return reported.value, unreported.value

    @property
    def fast_path_up(self) -> bool:
        """Whether lookups currently use the fast path."""
        if self._handle is None:
            raise ValueError("kvcm client is closed")
        return LIB.kvcm_client_fast_path_up(self._handle) == 1

    def __repr__(self):
        state = "closed" if self._handle is None else "open"
        return f"<kvcm.Client instance_id={getattr(self, 'instance_id', None)!r} {state}>"
