"""kvcm.Engine: the transfer engine of the kvcm client library over its C ABI — whole
blocks moved between Python buffers and the cache (pool nodes, the file tier).

    with kvcm.Engine("http://127.0.0.1:6381", "127.0.0.1:6382", "instance1") as engine:
        engine.put([1, 2], [[part_of_1], [part_of_2]])      # one buffer per spec
        outcomes = engine.get([1, 2], [[bytearray(1024)], [bytearray(1024)]])

Buffers are any C-contiguous buffer objects (bytes, bytearray, memoryview, NumPy arrays),
passed without copying; get needs writable ones that do not overlap. Each call blocks with
the GIL released.
"""

import ctypes
import os
from ctypes import byref, c_char_p, c_int32, c_size_t, c_void_p
from typing import List, NamedTuple

from . import _keys
from ._lib import LIB
from ._connected import Connected, raise_error

PUT_OUTCOMES = {1: "written", 2: "present", 3: "failed"}
GET_OUTCOMES = {1: "hit", 2: "miss", 3: "unreadable"}
PATHS = {
    0: "none",
    1: "pool-soft-tcp",
    2: "pool-soft-shm",
    3: "file",
    4: "pool-verbs",
    5: "pool-soft-tcp-zero-copy",
    6: "pool-verbs-zero-copy",
}


class Outcome(NamedTuple):
    """What became of one block: `status` (put: written / present / failed; get: hit /
    miss / unreadable) and the `path` its bytes took (none, pool-soft-tcp, pool-soft-shm,
    pool-verbs, file; pool-soft-tcp-zero-copy and pool-verbs-zero-copy for buffers inside
    registered memory)."""

    status: str
    path: str


def _address(buffer, writable):
    """(address, length, keep-alive) of a buffer object, without copying."""
    try:
        view = memoryview(buffer)
    except TypeError:
        raise TypeError(f"a block part must be a buffer (bytes, bytearray, ...), not {type(buffer).__name__}") from None
    if not view.c_contiguous:
        raise ValueError("a block part must be C-contiguous (kvcm does not copy it)")
    if view.nbytes == 0:
        return None, 0, view
    if view.readonly:
        if writable:
            raise ValueError("get needs writable buffers (bytearray, a writable memoryview, NumPy)")
        export = _keys._ReadOnlyExport(view)
        return export.view.buf, view.nbytes, export
    holder = (ctypes.c_char * view.nbytes).from_buffer(view.cast("B"))
    return ctypes.addressof(holder), view.nbytes, holder


def _parts(keys, blocks, writable):
    """The C arrays of a call: keys, parts per block, buffer pointers, lengths, keep-alives."""
    address, count, keep = _keys.pointer(keys)
    blocks = list(blocks)
    if len(blocks) != count:
        raise ValueError(f"{count} keys but {len(blocks)} blocks")
    specs = len(blocks[0]) if blocks else 0
    pointers = (c_void_p * (count * specs))()
    lengths = (c_size_t * (count * specs))()
    alive = [keep]
    for block, parts in enumerate(blocks):
        parts = list(parts)
        if len(parts) != specs:
            raise ValueError(f"block {block} has {len(parts)} parts, block 0 has {specs}")
        for spec, part in enumerate(parts):
            at, length, holder = _address(part, writable)
            pointers[block * specs + spec] = at
            lengths[block * specs + spec] = length
            alive.append(holder)
    return address, count, specs, pointers, lengths, alive


class Engine(Connected):
    """A transfer engine for one instance. Arguments as `kvcm.Client`, `api_key` and the
    `tls_*` ones included: the key goes with its gRPC calls and the fast path's bootstrap (a
    refused key makes put and get raise UnauthorizedError); with TLS, gRPC, the bootstrap and
    the pool directory speak TLS (a plaintext engine of a TLS server, or a refused handshake,
    makes them raise UnreachableError). `wire` is used for lookups and pool nodes. Calls on
    one engine run one at a time; use one per thread for parallel transfers."""

    _connect = LIB.kvcm_engine_connect_with
    _free = LIB.kvcm_engine_free

    def _call(self, function, names, keys, blocks, writable):
        if self._handle is None:
            raise ValueError("kvcm engine is closed")
        address, count, specs, pointers, lengths, alive = _parts(keys, blocks, writable)
        outcomes = (c_int32 * count)()
        paths = (c_int32 * count)()
        message = c_void_p()
        status = function(self._handle, address, count, specs, pointers, lengths, outcomes, paths, byref(message))
        del alive  # every buffer stayed exported until the call returned
        if status:
            raise_error(status, message)
        return [Outcome(names[o], PATHS[p]) for o, p in zip(outcomes, paths)]

    def register_memory(self, buffer):
        """Registers a writable, C-contiguous buffer (a bytearray, NumPy array, ...) for
        zero-copy transfers: parts of later puts and gets lying inside it move between the
        NIC and its bytes directly on soft-TCP and verbs, and file-tier parts through
        io_uring registered buffers. The buffer stays exported (it
        cannot be resized) until `deregister_memory` or `close`. Overlapping an already
        registered buffer raises InvalidArgumentError."""
        self._registered = getattr(self, "_registered", {})
        at, length, holder = _address(buffer, writable=True)
        if length == 0:
            raise ValueError("an empty buffer cannot be registered")
        self._registry_call(LIB.kvcm_engine_register_memory, at, length)
        self._registered[at] = holder

    def deregister_memory(self, buffer):
        """Forgets a buffer given to `register_memory` (InvalidArgumentError if it was not)."""
        at, _, _ = _address(buffer, writable=True)
        self._registry_call(LIB.kvcm_engine_deregister_memory, at)
        getattr(self, "_registered", {}).pop(at, None)

    def set_file_roots(self, roots):
        """Confines later puts and gets to files below `roots` (absolute paths: the storages'
        mounts); an empty list lifts it (any path outside the system directories). The server
        names every file an engine reads and writes: list the mounts so that no server can aim
        the engine elsewhere. A relative root raises InvalidArgumentError (nothing changes)."""
        encoded = [os.fsencode(root) for root in roots]
        if any(b"\0" in root for root in encoded):
            raise ValueError("a file root holds a NUL byte")
        array = (c_char_p * len(encoded))(*encoded)
        self._registry_call(LIB.kvcm_engine_set_file_roots, array, len(encoded))

    def _registry_call(self, function, *args):
        if self._handle is None:
            raise ValueError("kvcm engine is closed")
        message = c_void_p()
        status = function(self._handle, *args, byref(message))
        if status:
            raise_error(status, message)

    def close(self):
        """Frees the engine (idempotent), then releases the registered buffers."""
        super().close()
        getattr(self, "_registered", {}).clear()

    def put(self, keys, blocks) -> List[Outcome]:
        """Stores `blocks[i]` (one buffer per spec, sized as the spec) under `keys[i]`;
        blocks already cached are left alone."""
        return self._call(LIB.kvcm_engine_put, PUT_OUTCOMES, keys, blocks, writable=False)

    def get(self, keys, blocks) -> List[Outcome]:
        """Reads the cached blocks of `keys` into `blocks[i]` (writable, disjoint buffers);
        a block that is not a hit leaves its buffers holding nothing valid."""
        return self._call(LIB.kvcm_engine_get, GET_OUTCOMES, keys, blocks, writable=True)
