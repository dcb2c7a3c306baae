"""Loading libkvcm_ffi and declaring the C ABI of ffi/include/kvcm.h for ctypes.

The library is found, in order, at the path in the environment variable KVCM_FFI_LIB, or as
a copy bundled in this package directory (kvcm/libkvcm_ffi.so); otherwise importing kvcm
raises ImportError naming the build command. The structures here mirror kvcm.h field by
field; kvcm_abi_version() must be ABI_VERSION.
"""

import ctypes
import os
from ctypes import POINTER, Structure, c_char_p, c_int32, c_size_t, c_uint32, c_uint64, c_void_p

ABI_VERSION = 1
BUILD_COMMAND = "cargo build --release -p kvcm-ffi"
LIBRARY_NAME = "libkvcm_ffi.so"


class FlatView(Structure):
    """kvcm_flat_view: a whole result as flat arrays, borrowed from it."""

    _fields_ = [
        ("count", c_size_t),
        ("types", POINTER(c_int32)),
        ("spec_sizes", POINTER(c_int32)),
        ("spec_starts", POINTER(c_size_t)),
        ("spec_total", c_size_t),
        ("string_offsets", POINTER(c_size_t)),
        ("strings", c_void_p),
        ("strings_len", c_size_t),
    ]


class Tls(Structure):
    """kvcm_tls: PEM file paths (UTF-8, NUL-terminated; None is NULL) and the server name."""

    _fields_ = [
        ("ca_file", c_char_p),
        ("cert_file", c_char_p),
        ("key_file", c_char_p),
        ("server_name", c_char_p),
    ]


class FastPathMetrics(Structure):
    """kvcm_fast_path_metrics."""

    _fields_ = [
        ("hits", c_uint64),
        ("fallbacks", c_uint64),
        ("retries", c_uint64),
        ("extra_round_trips", c_uint64),
        ("reconnects", c_uint64),
    ]


def _path():
    """The library file to load, or ImportError saying how to get one."""
    configured = os.environ.get("KVCM_FFI_LIB")
    if configured:
        if not os.path.isfile(configured):
            raise ImportError(
                f"kvcm: KVCM_FFI_LIB={configured!r} is not a file; build the library with "
                f"`{BUILD_COMMAND}` and point KVCM_FFI_LIB at target/release/{LIBRARY_NAME}"
            )
        return configured
    bundled = os.path.join(os.path.dirname(os.path.abspath(__file__)), LIBRARY_NAME)
    if os.path.isfile(bundled):
        return bundled
    raise ImportError(
        f"kvcm: {LIBRARY_NAME} not found; build it with `{BUILD_COMMAND}` and set "
        f"KVCM_FFI_LIB=target/release/{LIBRARY_NAME} (or copy it into {os.path.dirname(bundled)})"
    )


def _declare(lib):
    """Argument and result types of every entry point."""
    out = POINTER(c_void_p)
    lookup = [c_void_p, c_void_p, c_size_t, out, out]
    ints = POINTER(c_int32)
    transfer = [c_void_p, c_void_p, c_size_t, c_size_t, POINTER(c_void_p), POINTER(c_size_t), ints, ints, out]
    signatures = {
        "kvcm_abi_version": ([], c_uint32),
        "kvcm_client_connect": ([c_char_p, c_char_p, c_char_p, c_int32, out, out], c_int32),
        "kvcm_client_connect_with_key": ([c_char_p, c_char_p, c_char_p, c_int32, c_char_p, out, out], c_int32),
        "kvcm_client_connect_tls": (
            [c_char_p, c_char_p, c_char_p, c_int32, c_char_p, POINTER(Tls), out, out],
            c_int32,
        ),
        "kvcm_client_free": ([c_void_p], None),
        "kvcm_prefix_match": (lookup, c_int32),
        "kvcm_batch_get": (lookup, c_int32),
        "kvcm_sliding_window": ([c_void_p, c_void_p, c_size_t, c_int32, out, out], c_int32),
        "kvcm_client_metrics": ([c_void_p, POINTER(FastPathMetrics)], c_int32),
        "kvcm_client_fast_path_up": ([c_void_p], c_int32),
        "kvcm_client_set_read_reports": ([c_void_p, c_int32], c_int32),
        "kvcm_client_flush_read_reports": ([c_void_p, POINTER(c_uint64), POINTER(c_uint64)], c_int32),
        "kvcm_locations_view": ([c_void_p, POINTER(FlatView)], c_int32),
        "kvcm_locations_count": ([c_void_p], c_size_t),
        "kvcm_locations_free": ([c_void_p], None),
        "kvcm_string_free": ([c_void_p], None),
        "kvcm_engine_connect": ([c_char_p, c_char_p, c_char_p, c_int32, out, out], c_int32),
        "kvcm_engine_connect_with": (
            [c_char_p, c_char_p, c_char_p, c_int32, c_char_p, POINTER(Tls), out, out],
            c_int32,
        ),
        "kvcm_engine_free": ([c_void_p], None),
        "kvcm_engine_put": (transfer, c_int32),
        "kvcm_engine_get": (transfer, c_int32),
        "kvcm_engine_register_memory": ([c_void_p, c_void_p, c_size_t, out], c_int32),
        "kvcm_engine_deregister_memory": ([c_void_p, c_void_p, out], c_int32),
        "kvcm_engine_set_file_roots": ([c_void_p, POINTER(c_char_p), c_size_t, out], c_int32),
    }
    for name, (argtypes, restype) in signatures.items():
        function = getattr(lib, name)
        function.argtypes = argtypes
        function.restype = restype


def load():
    """The loaded, declared library (ImportError when missing or of another ABI)."""
    path = _path()
    try:
        lib = ctypes.CDLL(path)
        _declare(lib)
    except (OSError, AttributeError) as error:
        raise ImportError(f"kvcm: cannot load {path}: {error}; rebuild with `{BUILD_COMMAND}`") from error
    version = lib.kvcm_abi_version()
    if version != ABI_VERSION:
        raise ImportError(f"kvcm: {path} has ABI {version}, this package needs {ABI_VERSION}")
    return lib


LIB = load()
