"""kvcm: Python client of the kvcm KV-cache manager, over libkvcm_ffi with ctypes.

    import kvcm
    with kvcm.Client("http://127.0.0.1:6381", "127.0.0.1:6382", "instance1") as client:
        for location in client.prefix_match([1, 2, 3]):
            print(location.type, location.spec_size, location.specs)

Keys may be an array('q'), a NumPy int64 array, a bytes-like buffer of int64, or a list of
ints; buffers are passed without copying. kvcm.Engine moves whole blocks (put / get) between
Python buffers and the cache. The library is found through KVCM_FFI_LIB or a
copy bundled in this package (see kvcm._lib).
"""

from ._lib import BUILD_COMMAND
from .client import Client, Location, Locations, Metrics
from .engine import Engine, Outcome
from .errors import (
    InvalidArgumentError,
    KvcmError,
    ServerError,
    UnauthorizedError,
    UnreachableError,
)

__all__ = [
    "BUILD_COMMAND",
    "Client",
    "Engine",
    "InvalidArgumentError",
    "KvcmError",
    "Location",
    "Locations",
    "Metrics",
    "Outcome",
    "ServerError",
    "UnauthorizedError",
    "UnreachableError",
]
