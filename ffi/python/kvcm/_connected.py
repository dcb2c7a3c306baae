"""What kvcm.Client and kvcm.Engine share: the checks of the connect arguments (strings,
the API key, the TLS settings as a kvcm_tls), raising a failed call's error, and
`Connected`, the base class that connects and frees the library object.
"""

import os
import threading
from ctypes import byref, c_void_p, string_at

from ._lib import LIB, Tls
from .errors import error

WIRES = {None: 0, "none": 0, "soft-tcp": 1, "soft-shm": 2, "verbs": 3}


def text(value, name):
    """A str argument as UTF-8 bytes (TypeError for another type, ValueError for a NUL)."""
    if not isinstance(value, str):
        raise TypeError(f"{name} must be str, not {type(value).__name__}")
    if "\0" in value:
        raise ValueError(f"{name} contains a NUL character")
    return value.encode("utf-8")


def path(value, name):
    """A file path argument (str or os.PathLike of str) as UTF-8 bytes; None stays None."""
    if value is None:
        return None
    fspath = os.fspath(value)
    if not isinstance(fspath, str):
        raise TypeError(f"{name} must be a str path, not {type(fspath).__name__}")
    return text(fspath, name)


def tls(ca, cert, key, server_name):
    """The kvcm_tls of the TLS arguments (None: plaintext), passed by reference."""
    if ca is None:
        named = (("tls_cert", cert), ("tls_key", key), ("tls_server_name", server_name))
        given = [name for name, value in named if value is not None]
        if given:
            raise ValueError(f"{', '.join(given)} given without tls_ca (TLS needs the servers' CA)")
        return None
    name = None if server_name is None else text(server_name, "tls_server_name")
    settings = Tls(path(ca, "tls_ca"), path(cert, "tls_cert"), path(key, "tls_key"), name)
    return byref(settings)


def raise_error(status, message):
    """Raises the error of a failed call, freeing its message."""
    words = string_at(message.value).decode("utf-8", "replace") if message.value else ""
    LIB.kvcm_string_free(message)
    raise error(status, words)


class Connected:
    """A library object connected to one instance (a client or an engine): connects in its
    constructor, frees itself on close (idempotent), in `with` or when collected. Subclasses
    name their C functions in `_connect` (one taking the API key and a kvcm_tls after the
    wire) and `_free` (held by the class, so that `__del__` still finds them while the
    interpreter shuts down). The arguments are those `kvcm.Client` documents."""

    _connect = None
    _free = None
    # Held while a handle is taken for freeing, so that two threads closing at once free it
    # once (a class attribute, like `_free`, for `__del__` at shutdown).
    _closing = threading.Lock()

    def __init__(
        self,
        grpc,
        http,
        instance_id,
        wire="soft-tcp",
        api_key=None,
        tls_ca=None,
        tls_cert=None,
        tls_key=None,
        tls_server_name=None,
    ):
        self._handle = None
        if wire not in WIRES:
            raise ValueError(f"wire must be one of 'soft-tcp', 'soft-shm', 'verbs', 'none', not {wire!r}")
        key = None if api_key is None else text(api_key, "api_key")
        settings = tls(tls_ca, tls_cert, tls_key, tls_server_name)
        handle, message = c_void_p(), c_void_p()
        args = (text(grpc, "grpc"), text(http, "http"), text(instance_id, "instance_id"))
        status = self._connect(*args, WIRES[wire], key, settings, byref(handle), byref(message))
        if status:
            raise_error(status, message)
        self._handle = handle
        self.instance_id = instance_id

    def close(self):
        """Frees the object (idempotent, and safe from several threads at once)."""
        with self._closing:
            handle, self._handle = getattr(self, "_handle", None), None
        self._release(handle)

    def _release(self, handle):
        if handle is not None:
            self._free(handle)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        # No lock: no other thread holds the object any more, and a collection that runs
        # this while the same thread is inside `close()` would wait on that lock for ever.
        handle, self._handle = getattr(self, "_handle", None), None
        self._release(handle)
