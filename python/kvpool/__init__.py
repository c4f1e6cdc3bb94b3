"""kvpool - Python client of kvpool, a key-value store for LLM KV-cache blocks.

    import kvpool
    with kvpool.Client("tcp://127.0.0.1:50051") as client:
        client.put("block-1", b"...")
        data = client.get("block-1")                # bytes; ObjectNotFoundError on a miss
        n = client.get_into("block-1", numpy_array)  # zero-copy into a caller buffer

kvpool.mooncake.MooncakeDistributedStore is a drop-in for Mooncake Store's Python class with
Mooncake's return conventions (integers, b"" on a miss) instead of exceptions.

The package binds libkvpool (include/kvpool.h) with ctypes; kvpool._native says where the
library is looked for. The package needs no third-party module: numpy and torch are used when
present. kvpool.kvpool_pb2 (generated from protocol/kvpool.proto by `make python-proto`) is the
wire protocol, for clients that speak ZeroMQ directly; it alone needs protobuf, and nothing
in the package imports it.
"""

from .status import *  # noqa: F401,F403 (Status, Error and one Error subclass per status)
from .status import Status, Error, strerror, status_name
from .client import (Client, PutOptions, SegmentInfo, connect, DEFAULT_ENDPOINT,
                     DEFAULT_TIMEOUT)
from .segment import SharedSegment
from . import _native

__version__ = "0.1.0"
library_path = _native.path
set_malloc_tuning = _native.set_malloc_tuning

__all__ = ["Client", "PutOptions", "SegmentInfo", "SharedSegment", "connect", "Status", "Error", "strerror",
           "status_name", "DEFAULT_ENDPOINT", "DEFAULT_TIMEOUT", "library_path",
           "set_malloc_tuning"]
