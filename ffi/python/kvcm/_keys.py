"""Block keys as a (pointer, count) pair for the C ABI, without copying buffers.

Accepted: array('q') (or another 8-byte signed typecode), any C-contiguous 1-D buffer of
int64 (a NumPy int64 array, a memoryview cast to 'q'), a bytes-like buffer of raw
native-endian int64 (bytes, bytearray; its length a multiple of 8), or any other iterable of
ints (a list, a tuple), which is converted to array('q') once.

Invariant: a buffer is never copied; while the C call runs (the GIL is released) the buffer
stays exported through the returned keep-alive, so it cannot be resized or freed under it.
"""

import ctypes
from array import array
from ctypes import POINTER, Structure, byref, c_int, c_ssize_t, c_void_p, py_object

_INT64_FORMATS = frozenset(["q", "@q", "=q", "l", "@l"])
_BYTE_FORMATS = frozenset(["B", "b", "c", "@B", "@b"])
_ARRAY_CODES = frozenset(code for code in "ql" if array(code).itemsize == 8)


class _PyBuffer(Structure):
    """Py_buffer of the CPython C API (used for read-only buffers only)."""

    _fields_ = [
        ("buf", c_void_p),
        ("obj", c_void_p),
        ("len", c_ssize_t),
        ("itemsize", c_ssize_t),
        ("readonly", c_int),
        ("ndim", c_int),
        ("format", c_void_p),
        ("shape", c_void_p),
        ("strides", c_void_p),
        ("suboffsets", c_void_p),
        ("internal", c_void_p),
    ]


_get_buffer = ctypes.pythonapi.PyObject_GetBuffer
_get_buffer.argtypes = [py_object, POINTER(_PyBuffer), c_int]
_get_buffer.restype = c_int
_release_buffer = ctypes.pythonapi.PyBuffer_Release
_release_buffer.argtypes = [POINTER(_PyBuffer)]
_release_buffer.restype = None


class _ReadOnlyExport:
    """Holds a read-only buffer exported (PyObject_GetBuffer) until released."""

    __slots__ = ("view",)

    def __init__(self, buffer):
        self.view = _PyBuffer()
        _get_buffer(buffer, byref(self.view), 0)

    def __del__(self):
        _release_buffer(byref(self.view))


def pointer(keys):
    """(address or bytes object, count, keep-alive) of `keys` for a lookup."""
    if type(keys) is array and keys.typecode in _ARRAY_CODES:
        address, count = keys.buffer_info()
        return address, count, memoryview(keys)
    if type(keys) is bytes:
        _check_bytes(len(keys))
        return keys, len(keys) >> 3, None
    if isinstance(keys, str):
        raise TypeError("keys must be int64 block keys (a list of ints or an int64 buffer), not str")
    try:
        view = memoryview(keys)
    except TypeError:
        return _converted(keys)
    return _buffer(view)


def _buffer(view):
    """The address and count of a buffer's keys, checked."""
    if view.format in _INT64_FORMATS and view.itemsize == 8:
        count = view.nbytes >> 3
    elif view.format in _BYTE_FORMATS:
        _check_bytes(view.nbytes)
        count = view.nbytes >> 3
    else:
        raise TypeError(f"keys buffer has format {view.format!r}; kvcm needs int64 ('q') keys")
    if view.ndim != 1 or not view.c_contiguous:
        raise ValueError("keys buffer must be 1-D and C-contiguous (kvcm does not copy it)")
    if count == 0:
        return None, 0, view
    if view.readonly:
        export = _ReadOnlyExport(view)
        return _aligned(export.view.buf), count, export
    holder = ctypes.c_char.from_buffer(view)
    return _aligned(ctypes.addressof(holder)), count, holder


def _aligned(address):
    if address & 7:
        raise ValueError("keys buffer is not aligned to 8 bytes")
    return address


def _check_bytes(length):
    if length & 7:
        raise ValueError(f"a bytes buffer of keys must hold whole int64 values; {length} bytes is not a multiple of 8")


def _converted(keys):
    """An iterable of ints as array('q') (the one copy, for non-buffer input)."""
    try:
        converted = array("q", keys)
    except TypeError:
        raise TypeError(f"keys must be int64 block keys: {_offender(keys)}") from None
    except OverflowError:
        raise OverflowError(f"keys must fit in int64: {_offender(keys)}") from None
    address, count = converted.buffer_info()
    return address, count, converted


def _offender(keys):
    """Which element of `keys` is not an int64 (for the error message)."""
    try:
        items = list(keys)
    except TypeError:
        return f"{type(keys).__name__} is not iterable"
    for index, key in enumerate(items):
        if not isinstance(key, int):
            return f"element {index} is {type(key).__name__} {key!r}"
        if not -(1 << 63) <= key < 1 << 63:
            return f"element {index} ({key}) is out of range"
    return "an element is not an int"
