"""vLLM's GPU path through the Mooncake drop-in, with the stand-in CUDA runtime.

vLLM's store connector registers each layer's KV-cache tensor with register_buffer and puts and
gets blocks with batch_put_from_multi_buffers / batch_get_into_multi_buffers: for each key, one
device address per layer. Here the "tensors" are device memory of build/lib/libfake_cudart.so
(tests/fake_cudart.c), which faults on any CPU access; libkvpool loads the same library
(KVPOOL_CUDART, set before the first call) and must stage every byte through pinned memory.
tests/test_device.c covers the C library itself; this is the drop-in's end of it.

Run by `make test` (cwd = repo root, KVPOOL_BIN = build/bin) with Debian's /usr/bin/python3.
"""

import ctypes
import os
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.normpath(os.path.join(HERE, "..", ".."))
FAKE = os.path.join(REPO, "build", "lib", "libfake_cudart.so")
sys.path.insert(0, os.path.join(REPO, "python"))

# libkvpool reads it once, at its first put or get: before any.
os.environ["KVPOOL_CUDART"] = FAKE

from kvpool_daemon import Kvpoold  # noqa: E402

LAYERS = 4
BLOCKS = 64
BLOCK_BYTES = 48 << 10        # one layer's share of one key: 48 KiB
H2D, D2H = 1, 2


@pytest.fixture(scope="module")
def cuda():
    """The stand-in runtime, the very copy libkvpool will load."""
    if not os.path.exists(FAKE):
        pytest.fail("%s is missing: run make" % FAKE)
    lib = ctypes.CDLL(FAKE)
    lib.cudaMalloc.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t]
    lib.cudaMemcpy.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    lib.cudaMemset.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t]
    lib.cudaFree.argtypes = [ctypes.c_void_p]
    lib.fake_cudart_log.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
    lib.fake_cudart_log.restype = ctypes.c_size_t
    lib.fake_cudart_fail_copies.argtypes = [ctypes.c_long, ctypes.c_int]
    return lib


@pytest.fixture(scope="module")
def store():
    from kvpool.mooncake import MooncakeDistributedStore
    daemon = Kvpoold("--segment-size", "256MiB", prefix="kvpool-device-test-")
    s = MooncakeDistributedStore()
    assert s.setup("localhost", "", 0, 16 << 20, "tcp", "",
                   daemon.endpoint[len("tcp://"):]) == 0
    yield s
    s.close()
    rc = daemon.stop()
    assert rc == 0, daemon.log_text(4000)
    daemon.remove()


def _device(cuda, size):
    """size bytes of zeroed device memory."""
    ptr = ctypes.c_void_p()
    assert cuda.cudaMalloc(ctypes.byref(ptr), size) == 0
    assert cuda.cudaMemset(ptr, 0, size) == 0
    return ptr.value


def _kv_cache(cuda):
    """LAYERS device buffers of BLOCKS blocks each: one per layer, as vLLM's."""
    return [_device(cuda, BLOCKS * BLOCK_BYTES) for _ in range(LAYERS)]


def _block(layer, block):
    return bytes(((layer * 131 + block * 7 + i) & 0xFF) for i in range(256)) * (BLOCK_BYTES // 256)


def _read(cuda, address, size):
    out = ctypes.create_string_buffer(size)
    assert cuda.cudaMemcpy(out, address, size, D2H) == 0
    return out.raw


def test_multi_buffers_round_trip(cuda, store):
    source = _kv_cache(cuda)
    for layer, base in enumerate(source):
        assert store.register_buffer(base, BLOCKS * BLOCK_BYTES) == 0
        for block in range(BLOCKS):
            data = _block(layer, block)
            assert cuda.cudaMemcpy(base + block * BLOCK_BYTES, data, BLOCK_BYTES, H2D) == 0
    blocks = list(range(0, BLOCKS, 3))
    keys = ["dev-block-%d" % b for b in blocks]
    ptrs = [[base + b * BLOCK_BYTES for base in source] for b in blocks]
    sizes = [[BLOCK_BYTES] * LAYERS for _ in blocks]
    assert store.batch_put_from_multi_buffers(keys, ptrs, sizes) == [0] * len(keys)
    assert store.get_size(keys[0]) == LAYERS * BLOCK_BYTES

    # Back into another cache, at other blocks.
    target = _kv_cache(cuda)
    for base in target:
        assert store.register_buffer(base, BLOCKS * BLOCK_BYTES) == 0
    where = [BLOCKS - 1 - b for b in blocks]
    ptrs = [[base + w * BLOCK_BYTES for base in target] for w in where]
    got = store.batch_get_into_multi_buffers(keys, ptrs, sizes)
    assert got == [LAYERS * BLOCK_BYTES] * len(keys)
    for b, w in zip(blocks, where):
        for layer, base in enumerate(target):
            assert _read(cuda, base + w * BLOCK_BYTES, BLOCK_BYTES) == _block(layer, b)
    # The host sees the same bytes.
    assert store.get(keys[1]) == b"".join(_block(layer, blocks[1]) for layer in range(LAYERS))
    for base in source + target:
        assert store.unregister_buffer(base) == 0
        cuda.cudaFree(base)
    assert store.remove_all(True) >= len(keys)


def test_single_buffer_calls(cuda, store):
    base = _device(cuda, BLOCKS * BLOCK_BYTES)
    data = bytes(range(256)) * 1024
    assert cuda.cudaMemcpy(base, data, len(data), H2D) == 0
    assert store.put_from("dev-one", base, len(data)) == 0
    assert store.batch_put_from(["dev-two"], [base + 4096], [8192]) == [0]
    assert cuda.cudaMemset(base, 0, BLOCKS * BLOCK_BYTES) == 0
    assert store.get_into("dev-one", base + BLOCK_BYTES, len(data)) == len(data)
    assert _read(cuda, base + BLOCK_BYTES, len(data)) == data
    assert store.batch_get_into(["dev-two"], [base], [8192]) == [8192]
    assert _read(cuda, base, 8192) == data[4096:4096 + 8192]
    cuda.cudaFree(base)
    assert store.remove_all(True) >= 2


def test_failed_copy_is_invalid_params(cuda, store):
    base = _device(cuda, BLOCK_BYTES)
    cuda.fake_cudart_fail_copies(0, 700)
    try:
        assert store.put_from("dev-fail", base, BLOCK_BYTES) == -600
    finally:
        cuda.fake_cudart_fail_copies(-1, 0)
    assert store.is_exist("dev-fail") == 0
    assert store.put_from("dev-fail", base, BLOCK_BYTES) == 0
    cuda.cudaFree(base)
    assert store.remove_all(True) >= 1
