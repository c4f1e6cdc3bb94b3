"""A connector-like workload through kvpool.mooncake, as vLLM's Mooncake store connector drives
it: a paged KV cache in numpy (per layer [2, blocks, block_size, heads, head_dim], so each
block is 2 x layers separate buffers), blocks saved with batch_put_from_multi_buffers under
content-hash keys, prefix lookups with batch_is_exist, and a load with
batch_get_into_multi_buffers into a second cache at other block ids, compared byte for byte.
Runs with the store contributing no memory and with it contributing a segment."""

import hashlib

import numpy as np
import pytest

from kvpool.mooncake import MooncakeDistributedStore, ReplicateConfig
from conftest import host_port

LAYERS, BLOCKS, BLOCK_SIZE, HEADS, HEAD_DIM = 4, 48, 16, 4, 32
PART_BYTES = BLOCK_SIZE * HEADS * HEAD_DIM * 2          # float16
KEY_BYTES = 2 * LAYERS * PART_BYTES


def make_cache(fill=None):
    rng = np.random.default_rng(fill) if fill is not None else None
    layers = []
    for _ in range(LAYERS):
        shape = (2, BLOCKS, BLOCK_SIZE, HEADS, HEAD_DIM)
        if rng is None:
            layers.append(np.zeros(shape, dtype=np.float16))
        else:
            layers.append(rng.standard_normal(shape).astype(np.float16))
    return layers


def block_hashes(tokens, prefix):
    """vLLM-style chained block hashes: each covers its block's tokens and every block before."""
    keys = []
    parent = b"root"
    for start in range(0, len(tokens) - len(tokens) % BLOCK_SIZE, BLOCK_SIZE):
        digest = hashlib.sha256(parent + np.asarray(tokens[start:start + BLOCK_SIZE],
                                                    dtype=np.int64).tobytes()).digest()
        parent = digest
        keys.append("%smodel@tp_rank:0@pcp0@dcp0@pp_rank:0@%s" % (prefix, digest.hex()))
    return keys


def block_buffers(cache, block_ids):
    """Per block: the addresses and sizes of its 2 x LAYERS parts, in a fixed order."""
    ptrs, sizes = [], []
    for b in block_ids:
        ptrs.append([cache[l][kv, b].ctypes.data for l in range(LAYERS) for kv in (0, 1)])
        sizes.append([PART_BYTES] * (2 * LAYERS))
    return ptrs, sizes


def lookup(store, keys):
    """Leading blocks present, the way the connector's lookup counts them."""
    hits = 0
    for present in store.batch_is_exist(keys):
        if present != 1:
            break
        hits += 1
    return hits


@pytest.mark.parametrize("segment_size", [0, 64 << 20], ids=["no-segment", "segment"])
def test_paged_kv_cache_round_trip(daemon, prefix, segment_size):
    store = MooncakeDistributedStore()
    assert store.setup("worker-0:7000", "P2PHANDSHAKE", segment_size, 64 << 20, "tcp", "",
                       host_port(daemon.endpoint)) == 0
    try:
        src = make_cache(fill=7)
        for layer in src:
            assert store.register_buffer(layer.ctypes.data, layer.nbytes) == 0
        rng = np.random.default_rng(11)
        tokens = rng.integers(0, 32000, 20 * BLOCK_SIZE + 5)
        keys = block_hashes(tokens, prefix)
        assert len(keys) == 20 and len(set(keys)) == 20
        src_blocks = rng.permutation(BLOCKS)[:20].tolist()

        assert lookup(store, keys) == 0
        ptrs, sizes = block_buffers(src, src_blocks)
        config = ReplicateConfig()
        if segment_size:
            config.preferred_segment = store.get_hostname()
        assert store.batch_put_from_multi_buffers(keys, ptrs, sizes, config) == [0] * 20
        # Blocks already stored: success, as in Mooncake (the first value stays).
        assert store.batch_put_from_multi_buffers(keys[:3], ptrs[:3], sizes[:3]) == [0] * 3
        assert all(store.get_size(k) == KEY_BYTES for k in keys)

        absent = block_hashes(rng.integers(0, 32000, 2 * BLOCK_SIZE), prefix)
        assert store.batch_is_exist(keys + absent) == [1] * 20 + [0] * 2
        assert lookup(store, keys) == 20
        # Another request sharing the first 12 blocks of tokens, then diverging.
        other = np.concatenate([tokens[:12 * BLOCK_SIZE],
                                rng.integers(0, 32000, 8 * BLOCK_SIZE)])
        assert lookup(store, block_hashes(other, prefix)) == 12

        dst = make_cache()
        dst_blocks = rng.permutation(BLOCKS)[:20].tolist()
        out_ptrs, out_sizes = block_buffers(dst, dst_blocks)
        assert store.batch_get_into_multi_buffers(keys, out_ptrs, out_sizes) == [KEY_BYTES] * 20
        for s, d in zip(src_blocks, dst_blocks):
            for l in range(LAYERS):
                assert src[l][:, s].tobytes() == dst[l][:, d].tobytes()
        untouched = sorted(set(range(BLOCKS)) - set(dst_blocks))
        for l in range(LAYERS):
            assert not dst[l][:, untouched].any()

        # A partial load (the first 5 blocks) into a third cache, as a prefix hit would do.
        third = make_cache()
        part_ptrs, part_sizes = block_buffers(third, list(range(5)))
        assert store.batch_get_into_multi_buffers(keys[:5], part_ptrs,
                                                  part_sizes) == [KEY_BYTES] * 5
        for i in range(5):
            for l in range(LAYERS):
                assert src[l][:, src_blocks[i]].tobytes() == third[l][:, i].tobytes()
        for layer in src:
            assert store.unregister_buffer(layer.ctypes.data) == 0
        assert store.remove_by_regex("^" + prefix, force=True) == 20
        assert lookup(store, keys) == 0
    finally:
        store.close()
