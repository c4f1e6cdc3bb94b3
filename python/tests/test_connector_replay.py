"""Replays of the Mooncake connectors' call sequences against kvpoold through
kvpool.mooncake.install() (`from mooncake.store import ...` loads kvpool's drop-in), with numpy
arrays standing in for the tensors. Each replay follows the connector's current source, call
for call, argument for argument, and checks what the connector checks:

- vLLM's MooncakeStoreConnector worker (vllm-project/vllm,
  vllm/backends/distributed/kv_transfer/kv_connector/v1/mooncake/store/worker.py, formerly
  vllm/distributed/kv_transfer/kv_connector/v1/mooncake/store/worker.py; keys from store/data.py):
  setup from MOONCAKE_CONFIG_PATH (tenant_id passed when not "default"), register_buffer per KV
  cache region, the sending thread's batch_is_exist dedup then batch_put_from_multi_buffers with
  ReplicateConfig.group_ids (enable_group_semantics), the scheduler's lookup over every rank
  namespace, the receiving thread's tier log (batch_get_replica_desc) and
  batch_get_into_multi_buffers, the reset's remove_all(force=True), close().
- SGLang's HiCache Mooncake backend (sgl-project/sglang,
  python/sglang/srt/mem_cache/storage/mooncake_store/mooncake_store.py): setup with the
  transfer engine positional and the SSD / tenant keywords (and its standalone-storage mode:
  MooncakeHostMemAllocator then setup_dummy), warmup, register_buffer, batch_set_v1 (exist,
  then batch_put_from of the missing keys, with group_ids), batch_exists, batch_get_v1
  (batch_get_into), the layer-first multi-buffer forms, the cross-layout fallback's get_batch /
  get, clear()'s remove_all().
- SGLang's Mooncake direct linker (.../mooncake_store/mooncake_direct_linker.py):
  register_buffer, the offload (batch_set_v2), lookup (batch_exists_v2), and the layer-wise
  load: batch_get_session_start_with_sources, per layer batch_get_into_multi_buffer_ranges,
  batch_get_session_end, record_prefetched_tokens; and the session methods it probes with
  getattr (dfs_prefetch_arena_available, batch_get_session_prefetch,
  batch_get_session_refresh, get_lease_ttl_ms) as it uses them when they are there.
- LMCache's Mooncake connector (LMCache/LMCache,
  lmcache/v1/storage_backend/connector/mooncakestore_connector.py): setup from
  MOONCAKE_CONFIG_PATH, ReplicateConfig with preferred_segment = get_hostname(),
  register_buffer of the pinned CPU buffer, exists, put_from (no chunk metadata) and put_parts
  (with it), batched get through batch_get_into and batch_get_buffer, unregister_buffer,
  close().

A step that needs a method kvpool's drop-in does not have yet is skipped with a message naming
it (batch_get_into_multi_buffer_ranges, over the ranged GET, is being added)."""

import asyncio
import hashlib
import json
import os
import socket
import struct
import sys
import time

import numpy as np
import pytest

from kvpool import mooncake as kvpool_mooncake
from kvpool_daemon import Kvpoold
from conftest import host_port

MISSING_RANGES = ("batch_get_into_multi_buffer_ranges is missing from kvpool's drop-in")


@pytest.fixture
def daemon():
    """A kvpoold of the test's own: the replays wipe a tenant with remove_all as the
    connectors' reset and clear do."""
    server = Kvpoold("--segment-size", "128MiB", prefix="kvpool-pytest-replay-")
    yield server
    rc = server.stop()
    assert rc == 0, "kvpoold exited with %s:\n%s" % (rc, server.log_text(4000))
    server.remove()


@pytest.fixture
def mooncake_store(monkeypatch):
    """`mooncake.store` as the connectors import it: kvpool's drop-in. Under
    KVPOOL_REPLAY_WHEEL=1 (python/tests/test_wheel.py runs this file in a virtualenv with the
    wheels installed) the mooncake-kvpool wheel's package, imported as an engine does."""
    if os.environ.get("KVPOOL_REPLAY_WHEEL") == "1":
        import mooncake.store
        assert mooncake.store is kvpool_mooncake
        yield mooncake.store
        return
    for name in ("mooncake", "mooncake.store"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    module = kvpool_mooncake.install(force=True)
    import mooncake.store
    assert mooncake.store is module
    yield mooncake.store


def write_config(tmp_path, monkeypatch, endpoint, **fields):
    """The MOONCAKE_CONFIG_PATH file: docs/engines.md's (KVPOOL_REPLAY_CONFIG, set by
    test_wheel.py) or the same fields here, pointed at the test's node, with the test's fields."""
    if os.environ.get("KVPOOL_REPLAY_CONFIG"):
        config = json.loads(os.environ["KVPOOL_REPLAY_CONFIG"])
    else:
        config = {"local_hostname": "127.0.0.1", "metadata_server": "P2PHANDSHAKE",
                  "global_segment_size": 0, "local_buffer_size": 64 << 20, "protocol": "tcp",
                  "device_name": ""}
    config["master_server_address"] = host_port(endpoint)
    config.update(fields)
    path = tmp_path / "mooncake.json"
    path.write_text(json.dumps(config))
    monkeypatch.setenv("MOONCAKE_CONFIG_PATH", str(path))
    return config


def chained_hashes(tokens, block_size, salt=b""):
    """vLLM-style block hashes: each covers its block and every block before it."""
    out, parent = [], b"root" + salt
    for start in range(0, len(tokens) - len(tokens) % block_size, block_size):
        parent = hashlib.sha256(parent + np.asarray(tokens[start:start + block_size],
                                                    dtype=np.int64).tobytes()).digest()
        out.append(parent)
    return out


# ---- vLLM: MooncakeStoreConnector's worker --------------------------------------------------

class VllmTokenDatabase:
    """vLLM's ChunkedTokenDatabase (store/data.py): keys and the addresses of a block's
    per-segment pages."""

    def __init__(self, model, tp_rank, group_id, block_size, cache_prefix=""):
        self.model, self.tp_rank, self.group_id = model, tp_rank, group_id
        self.block_size = block_size
        self.cache_prefix = cache_prefix
        self.base_addrs, self.block_len = [], []

    def prefix(self, tp_rank=None):
        head = "%s@" % self.cache_prefix if self.cache_prefix else ""
        return "%s%s@tp_rank:%d@pcp0@dcp0@pp_rank:0@group:%d" % (
            head, self.model, self.tp_rank if tp_rank is None else tp_rank, self.group_id)

    def key_for(self, block_hash, tp_rank=None):
        return "%s@%s" % (self.prefix(tp_rank), block_hash.hex())

    def prepare_values(self, block_ids):
        base = np.asarray(self.base_addrs, dtype=np.int64)
        blen = np.asarray(self.block_len, dtype=np.int64)
        bids = np.asarray(block_ids, dtype=np.int64)
        addrs = base[None, :] + bids[:, None] * blen[None, :]
        sizes = np.broadcast_to(blen[None, :], addrs.shape)
        return addrs.tolist(), sizes.tolist()


class VllmWorker:
    """The calls MooncakeStoreWorker and its sending / receiving threads make."""

    LAYERS, BLOCKS, BLOCK_SIZE, HEADS, HEAD_DIM = 3, 32, 16, 2, 16

    def __init__(self, mc, tp_rank, tp_size, kv_role, fill, enable_group_semantics=True):
        from mooncake.store import MooncakeDistributedStore, ReplicateConfig
        with open(os.environ["MOONCAKE_CONFIG_PATH"]) as file:
            config = json.load(file)
        tenant_id = (config.get("tenant_id") or "default").strip() or "default"
        self.store = MooncakeDistributedStore()
        setup_kwargs = {}
        if tenant_id != "default":
            setup_kwargs["tenant_id"] = tenant_id
        ret = self.store.setup("127.0.0.1", config["metadata_server"],
                               kvpool_mooncake.parse_size(config["global_segment_size"]),
                               kvpool_mooncake.parse_size(config["local_buffer_size"]),
                               config["protocol"], config["device_name"],
                               config["master_server_address"], **setup_kwargs)
        if ret != 0:
            raise RuntimeError("Initialize MooncakeDistributedStore failed.")
        self.replicate_config = ReplicateConfig()
        self.supports_group_ids = (hasattr(ReplicateConfig, "group_ids")
                                   or hasattr(self.replicate_config, "group_ids"))
        self.enable_group_semantics = enable_group_semantics
        self.tp_rank, self.tp_size, self.kv_role = tp_rank, tp_size, kv_role
        self.db = VllmTokenDatabase("Qwen3-8B", tp_rank, 0, self.BLOCK_SIZE)
        rng = np.random.default_rng(fill)
        # FlashAttention's layout per layer: (2, num_blocks, block_size, heads, head_dim).
        self.kv_caches = {
            "layer.%d" % l: rng.standard_normal(
                (2, self.BLOCKS, self.BLOCK_SIZE, self.HEADS, self.HEAD_DIM)).astype(np.float16)
            for l in range(self.LAYERS)}
        self.register_kv_caches()

    def register_kv_caches(self):
        addrs, block_lens = [], []
        for cache in self.kv_caches.values():
            base_addr, region_len = cache.ctypes.data, cache.nbytes
            ret = self.store.register_buffer(base_addr, region_len)
            assert ret == 0, "register_buffer failed for addr %#x len %d: %d" % (
                base_addr, region_len, ret)
            seg_stride = cache.strides[0]                  # K/V-first: one segment each
            for idx in range(cache.shape[0]):
                addrs.append(base_addr + idx * seg_stride)
                block_lens.append(seg_stride // self.BLOCKS)
        self.db.base_addrs, self.db.block_len = addrs, block_lens

    def save(self, block_hashes, block_ids):
        """KVCacheStoreSendingThread._handle_request: dedup, group ids, one put."""
        keys = [self.db.key_for(h) for h in block_hashes]
        exists_states = self.store.batch_is_exist(keys)
        missing = [i for i, e in enumerate(exists_states) if e != 1]
        if not missing:
            return []
        keys = [keys[i] for i in missing]
        block_ids = [block_ids[i] for i in missing]
        if self.enable_group_semantics and self.supports_group_ids:
            self.replicate_config.group_ids = [
                "vllm-mooncake-store:%s@%s" % (self.db.model, key.rsplit("@", 1)[-1])
                for key in keys]
        addrs, sizes = self.db.prepare_values(block_ids)
        res = self.store.batch_put_from_multi_buffers(keys, addrs, sizes,
                                                      self.replicate_config)
        failed = [i for i, v in enumerate(res) if v < 0]
        return [(keys[i], res[i]) for i in failed]

    def lookup(self, block_hashes):
        """MooncakeStoreWorker.lookup: a block is there when every rank namespace has it."""
        candidates = [self.db.key_for(h, tp_rank=r) for h in block_hashes
                      for r in range(self.tp_size)]
        res = self.store.batch_is_exist(candidates)
        hits = 0
        for i in range(len(block_hashes)):
            if not all(res[i * self.tp_size + r] == 1 for r in range(self.tp_size)):
                break
            hits += 1
        return hits * self.BLOCK_SIZE

    def load(self, block_hashes, block_ids, tier_log=True):
        """KVCacheStoreRecvingThread._handle_request, with VLLM_MOONCAKE_STORE_TIER_LOG."""
        keys = [self.db.key_for(h) for h in block_hashes]
        addrs, sizes = self.db.prepare_values(block_ids)
        rotation = self.tp_rank % len(keys)
        keys, addrs, sizes = (keys[rotation:] + keys[:rotation], addrs[rotation:]
                              + addrs[:rotation], sizes[rotation:] + sizes[:rotation])
        tiers = None
        if tier_log:
            descs = self.store.batch_get_replica_desc(keys)
            tiers = {k: ("memory" if descs.get(k) and descs[k][0].is_memory_replica()
                         else "unknown") for k in keys}
        res = self.store.batch_get_into_multi_buffers(keys, addrs, sizes)
        return [(k, v) for k, v in zip(keys, res) if v < 0], tiers

    def block(self, block_id):
        return b"".join(self.kv_caches["layer.%d" % l][kv, block_id].tobytes()
                        for l in range(self.LAYERS) for kv in (0, 1))

    def reset(self):
        self.store.remove_all(force=True)

    def close(self):
        store, self.store = self.store, None
        store.close()


@pytest.mark.parametrize("tenant", ["default", "vllm-tenant"])
def test_vllm_store_connector(daemon, mooncake_store, tmp_path, monkeypatch, tenant, prefix):
    write_config(tmp_path, monkeypatch, daemon.endpoint, tenant_id=tenant,
                 global_segment_size=32 << 20, mode="embedded")
    producer = VllmWorker(mooncake_store, tp_rank=0, tp_size=1, kv_role="kv_producer", fill=1)
    consumer = VllmWorker(mooncake_store, tp_rank=0, tp_size=1, kv_role="kv_consumer", fill=2)
    try:
        tokens = list(range(8 * VllmWorker.BLOCK_SIZE))
        hashes = chained_hashes(tokens, VllmWorker.BLOCK_SIZE, prefix.encode())
        src_blocks = [3, 9, 4, 20, 7, 11, 0, 30]
        assert consumer.lookup(hashes) == 0
        assert producer.save(hashes[:5], src_blocks[:5]) == []
        assert consumer.lookup(hashes) == 5 * VllmWorker.BLOCK_SIZE
        # A later step of the same request saves the whole prefix: the first five blocks
        # are deduplicated by batch_is_exist, the rest put.
        assert producer.save(hashes, src_blocks) == []
        # Another producer racing on the same blocks (its put finds them there): success.
        racer = VllmWorker(mooncake_store, 0, 1, "kv_producer", fill=1)
        keys = [racer.db.key_for(h) for h in hashes[:2]]
        addrs, sizes = racer.db.prepare_values(src_blocks[:2])
        assert racer.store.batch_put_from_multi_buffers(
            keys, addrs, sizes, racer.replicate_config) == [0, 0]
        racer.close()
        assert consumer.lookup(hashes) == 8 * VllmWorker.BLOCK_SIZE
        dst_blocks = [1, 2, 5, 6, 8, 10, 12, 13]
        failures, tiers = consumer.load(hashes, dst_blocks)
        assert failures == []
        assert set(tiers.values()) == {"memory"}
        for s, d in zip(src_blocks, dst_blocks):
            assert consumer.block(d) == producer.block(s)
        # A block evicted (removed) under the consumer: the load reports it, the rest load.
        gone = producer.db.key_for(hashes[6])
        assert producer.store.remove(gone, force=True) == 0
        failures, _ = consumer.load(hashes, dst_blocks, tier_log=False)
        assert failures == [(gone, -704)]
        consumer.reset()                  # LookupKeyServer's RESET_MSG: remove_all(force=True)
        assert producer.lookup(hashes) == 0
    finally:
        producer.close()
        consumer.close()


# ---- SGLang: the HiCache Mooncake backend ---------------------------------------------------

class SglangHostPool:
    """A page-first MHA host KV pool: per page a K and a V buffer (get_page_buffer_meta)."""

    def __init__(self, pages, page_bytes, allocator=None, fill=0):
        self.page_size = 1
        total = 2 * pages * page_bytes
        if allocator is not None:
            import ctypes
            ptr = allocator.alloc(total)
            self.kv_buffer = np.frombuffer((ctypes.c_byte * total).from_address(ptr),
                                           dtype=np.uint8)
            self.ptr = ptr
        else:
            self.kv_buffer = np.zeros(total, dtype=np.uint8)
        self.kv_buffer[:] = np.random.default_rng(fill).integers(0, 255, total, dtype=np.uint8)
        self.page_bytes = page_bytes
        self.pages = pages

    def get_page_buffer_meta(self, indices):
        ptrs, sizes = [], []
        base = self.kv_buffer.ctypes.data
        for page in indices:
            ptrs.append(base + (2 * page) * self.page_bytes)
            ptrs.append(base + (2 * page + 1) * self.page_bytes)
            sizes += [self.page_bytes, self.page_bytes]
        return ptrs, sizes

    def page(self, index):
        return self.kv_buffer[2 * index * self.page_bytes:(2 * index + 2) * self.page_bytes]


class SglangMooncakeStore:
    """MooncakeStore's calls into MooncakeDistributedStore (mooncake_store.py)."""

    def __init__(self, endpoint, mem_pool, standalone=False, tenant_id="default",
                 enable_ssd_offload=False, ssd_offload_path=None, group_semantics=True,
                 config_prefix="sgl-tag_Qwen-Qwen3-8B"):
        from mooncake.store import MooncakeDistributedStore, ReplicateConfig
        self.store = MooncakeDistributedStore()
        self.ReplicateConfig = ReplicateConfig
        self.use_group_semantics = group_semantics and hasattr(ReplicateConfig, "group_ids")
        self.config_prefix = config_prefix
        self.mha_suffix = "0"
        if standalone:
            ret_code = self.store.setup_dummy(mem_pool.kv_buffer.nbytes, 16 * 1024 * 1024,
                                              host_port(endpoint))
        else:
            setup_kwargs = {}
            if enable_ssd_offload:
                setup_kwargs["enable_ssd_offload"] = True
            if ssd_offload_path is not None:
                setup_kwargs["ssd_offload_path"] = ssd_offload_path
            if tenant_id != "default":
                setup_kwargs["tenant_id"] = tenant_id
            while True:
                try:
                    ret_code = self.store.setup("localhost", "P2PHANDSHAKE", 16 << 20,
                                                16 * 1024 * 1024, "tcp", "",
                                                host_port(endpoint), None, **setup_kwargs)
                    break
                except TypeError as e:      # SGLang retries without unsupported keywords
                    unsupported = [k for k in list(setup_kwargs) if k in str(e)]
                    if not unsupported:
                        raise
                    for k in unsupported:
                        setup_kwargs.pop(k)
        if ret_code:
            raise RuntimeError("Failed to setup Mooncake store, error code: %s" % ret_code)
        self.warmup()
        self.mem_pool_host = mem_pool
        ret_code = self.store.register_buffer(mem_pool.kv_buffer.ctypes.data,
                                              mem_pool.kv_buffer.nbytes)
        if ret_code != 0:
            raise RuntimeError("Failed to register buffer to Mooncake Store, error code: %d"
                               % ret_code)

    def warmup(self):
        warmup_key = "sglang_mooncake_store_warmup_key" + hashlib.md5(
            str(id(self)).encode()).hexdigest()
        warmup_value = bytes(4 * 1024)
        for _ in range(10):
            if self.store.put(warmup_key, warmup_value) == 0:
                break
        else:
            raise RuntimeError("Warmup put failed")
        assert self.store.is_exist(warmup_key) == 1
        assert self.store.get(warmup_key) == warmup_value

    def _tag_keys(self, keys):
        return ["%s_%s" % (self.config_prefix, k) for k in keys] if self.config_prefix else keys

    def _mha_meta(self, keys, indices):
        ptrs, sizes = self.mem_pool_host.get_page_buffer_meta(indices)
        key_list = []
        for key in keys:
            key_list += ["%s_%s_k" % (key, self.mha_suffix), "%s_%s_v" % (key, self.mha_suffix)]
        return key_list, ptrs, sizes

    @staticmethod
    def _postprocess(results, is_set, key_multiplier=2):
        groups = [results[i:i + key_multiplier] for i in range(0, len(results), key_multiplier)]
        return [all(r == 0 for r in g) if is_set else all(r > 0 for r in g) for g in groups]

    def _put_zero_copy(self, keys, ptrs, sizes, group_ids=None):
        config = None
        if self.use_group_semantics and group_ids is not None:
            assert len(group_ids) == len(keys)
            config = self.ReplicateConfig()
            config.group_ids = group_ids
        if ptrs and isinstance(ptrs[0], (list, tuple)):
            config = config or self.ReplicateConfig()
            return self.store.batch_put_from_multi_buffers(keys, ptrs, sizes, config)
        if config is not None:
            return self.store.batch_put_from(keys, ptrs, sizes, config)
        return self.store.batch_put_from(keys, ptrs, sizes)

    def _get_zero_copy(self, keys, ptrs, sizes):
        if ptrs and isinstance(ptrs[0], (list, tuple)):
            return self.store.batch_get_into_multi_buffers(keys, ptrs, sizes)
        return self.store.batch_get_into(keys, ptrs, sizes)

    def batch_set_v1(self, keys, host_indices):
        keys = self._tag_keys(keys)
        key_strs, ptrs, sizes = self._mha_meta(keys, host_indices)
        group_ids = ([("sglang-hicache:%s" % k) for k in keys for _ in range(2)]
                     if self.use_group_semantics else None)
        exist_result = self.store.batch_is_exist(key_strs)
        set_idx = [i for i in range(len(key_strs)) if exist_result[i] != 1]
        set_results = [0 if exist_result[i] == 1 else -1 for i in range(len(key_strs))]
        if set_idx:
            put_results = self._put_zero_copy(
                [key_strs[i] for i in set_idx], [ptrs[i] for i in set_idx],
                [sizes[i] for i in set_idx],
                [group_ids[i] for i in set_idx] if group_ids else None)
            for i, r in zip(set_idx, put_results):
                set_results[i] = r
        return self._postprocess(set_results, True)

    def batch_exists(self, keys):
        keys = self._tag_keys(keys)
        query = [k for key in keys for k in ("%s_%s_k" % (key, self.mha_suffix),
                                             "%s_%s_v" % (key, self.mha_suffix))]
        exist = self.store.batch_is_exist(query)
        for i in range(len(query)):
            if exist[i] != 1:
                return i // 2
        return len(query) // 2

    def batch_get_v1(self, keys, host_indices):
        keys = self._tag_keys(keys)
        key_strs, ptrs, sizes = self._mha_meta(keys, host_indices)
        return self._postprocess(self._get_zero_copy(key_strs, ptrs, sizes), False)

    def clear(self):
        self.store.remove_all()


@pytest.mark.parametrize("mode", ["embedded", "standalone"])
def test_sglang_hicache_backend(daemon, mooncake_store, mode, prefix):
    page_bytes = 4096
    allocator = mooncake_store.MooncakeHostMemAllocator() if mode == "standalone" else None
    src = SglangHostPool(16, page_bytes, allocator=allocator, fill=3)
    dst = SglangHostPool(16, page_bytes, fill=4)
    tenant = "sgl-" + prefix[2:-1]
    if mode == "standalone":
        # Host memory from MooncakeHostMemAllocator, then setup_dummy (default tenant).
        writer = SglangMooncakeStore(daemon.endpoint, src, standalone=True)
        tenant = "default"
    else:
        with pytest.warns(kvpool_mooncake.KvpoolDropInWarning, match="ssd_offload"):
            writer = SglangMooncakeStore(daemon.endpoint, src, tenant_id=tenant,
                                         enable_ssd_offload=True,
                                         ssd_offload_path="/nvme/offload")
    reader = SglangMooncakeStore(daemon.endpoint, dst, tenant_id=tenant)
    try:
        pages = [prefix + "page%d" % i for i in range(6)]
        assert reader.batch_exists(pages) == 0
        assert writer.batch_set_v1(pages[:4], [0, 1, 2, 3]) == [True] * 4
        assert reader.batch_exists(pages) == 4
        # Backing up an overlapping range: the existing pages answer 0 (success).
        assert writer.batch_set_v1(pages, [0, 1, 2, 3, 4, 5]) == [True] * 6
        assert reader.batch_get_v1(pages, [10, 11, 12, 13, 14, 15]) == [True] * 6
        for s_i, d_i in zip(range(6), range(10, 16)):
            assert np.array_equal(src.page(s_i), dst.page(d_i))
        assert reader.batch_get_v1([prefix + "absent"], [9]) == [False]
        # The cross-layout fallback's whole-object reads.
        key0 = reader._tag_keys([pages[0]])[0] + "_0_k"
        blobs = reader.store.get_batch([key0, key0 + "-missing"])
        assert blobs == [src.page(0)[:page_bytes].tobytes(), b""]
        assert reader.store.get(key0) == blobs[0]
        # Layer-first (MLA) pages: one object from several buffers.
        layer_keys = [prefix + "mla%d" % i for i in range(3)]
        ptrs = [[src.kv_buffer.ctypes.data + (3 * i + j) * 512 for j in range(3)]
                for i in range(3)]
        sizes = [[512] * 3 for _ in range(3)]
        assert writer._put_zero_copy(layer_keys, ptrs, sizes,
                                     ["sglang-hicache:%s" % k for k in layer_keys]) == [0] * 3
        out = np.zeros(3 * 3 * 512, dtype=np.uint8)
        out_ptrs = [[out.ctypes.data + (3 * i + j) * 512 for j in range(3)] for i in range(3)]
        assert reader._get_zero_copy(layer_keys, out_ptrs, sizes) == [1536] * 3
        assert np.array_equal(out, src.kv_buffer[:out.nbytes])
        # clear(): remove_all() without force takes what no reader holds a lease on.
        assert writer.batch_set_v1([prefix + "cold"], [6]) == [True]
        reader.clear()
        assert writer.batch_exists([prefix + "cold"]) == 0
        assert writer.batch_exists(pages) == 6                  # read just now: leased
    finally:
        writer.store.close()
        reader.store.close()
        if allocator is not None:
            assert allocator.free(src.ptr) == 0


# ---- SGLang: the Mooncake direct linker -------------------------------------------------------

class SglangDirectLinker:
    """MooncakeDirectLinker's calls (mooncake_direct_linker.py) over an SglangMooncakeStore."""

    def __init__(self, storage, num_layers, page_bytes):
        self.storage = storage
        self.num_layers = num_layers
        self.page_bytes = page_bytes
        self.skipped = []
        pool = storage.mem_pool_host
        result = storage.store.register_buffer(pool.kv_buffer.ctypes.data, pool.kv_buffer.nbytes)
        if result not in (0, None):
            raise RuntimeError("Failed to register GPU KV buffer with Mooncake, error code: %s"
                               % result)

    def lookup(self, page_keys):
        return self.storage.batch_exists(page_keys)

    def offload(self, page_keys, host_indices):
        return all(self.storage.batch_set_v1(page_keys, host_indices))

    def load_layer_wise(self, page_keys, dst_pool, dst_indices, page_size_tokens=64):
        keys, _, _ = self.storage._mha_meta(self.storage._tag_keys(page_keys), dst_indices)
        store = self.storage.store
        start_with_sources = getattr(store, "batch_get_session_start_with_sources", None)
        if start_with_sources is None:
            result = list(store.batch_get_session_start(keys))
            sources = [None] * len(keys)
        else:
            result, sources = start_with_sources(keys)
            result, sources = list(result), list(sources)
        if result != [0] * len(keys):
            raise RuntimeError("Mooncake get session start failed: keys=%d, results=%s"
                               % (len(keys), result))
        success = False
        try:
            ranged = getattr(store, "batch_get_into_multi_buffer_ranges", None)
            if ranged is None:
                self.skipped.append(MISSING_RANGES)
            else:
                layer_bytes = self.page_bytes // self.num_layers
                for layer in range(self.num_layers):
                    base = dst_pool.kv_buffer.ctypes.data
                    ptrs = [[base + (2 * p + kv) * self.page_bytes + layer * layer_bytes]
                            for p in dst_indices for kv in (0, 1)]
                    sizes = [[layer_bytes] for _ in keys]
                    offsets = [[layer * layer_bytes] for _ in keys]
                    res = ranged(keys, ptrs, sizes, offsets)
                    if res is None or isinstance(res, int) or list(res) != [sum(x) for x
                                                                            in sizes]:
                        raise RuntimeError("Mooncake range get failed: %s" % (res,))
            success = True
        finally:
            if success:
                recorder = getattr(store, "record_prefetched_tokens", None)
                if recorder is not None:
                    recorder(len(page_keys) * page_size_tokens)
            store.batch_get_session_end(keys)
        return sources


def test_sglang_direct_linker(daemon, mooncake_store, prefix):
    page_bytes, layers = 3 * 1024, 3
    src = SglangHostPool(8, page_bytes, fill=5)
    dst = SglangHostPool(8, page_bytes, fill=6)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        http_port = sock.getsockname()[1]
    storage = SglangMooncakeStore(daemon.endpoint, src)
    # The linker's MooncakeStore(..., enable_client_http_server=params.enable_metrics).
    reader_store = mooncake_store.MooncakeDistributedStore()
    assert reader_store.setup("localhost", "P2PHANDSHAKE", 0, 16 << 20, "tcp", "",
                              host_port(daemon.endpoint), None,
                              enable_client_http_server=True, client_http_port=http_port) == 0
    reader = SglangMooncakeStore.__new__(SglangMooncakeStore)
    reader.store, reader.mem_pool_host = reader_store, dst
    reader.config_prefix, reader.mha_suffix = storage.config_prefix, storage.mha_suffix
    reader.use_group_semantics, reader.ReplicateConfig = True, mooncake_store.ReplicateConfig
    try:
        linker = SglangDirectLinker(storage, layers, page_bytes)
        reader_linker = SglangDirectLinker(reader, layers, page_bytes)
        pages = [prefix + "dl%d" % i for i in range(4)]
        assert reader_linker.lookup(pages) == 0
        assert linker.offload(pages, [0, 1, 2, 3])
        assert reader_linker.lookup(pages) == 4
        sources = reader_linker.load_layer_wise(pages, dst, [4, 5, 6, 7])
        assert sources == ["memory"] * 8
        if MISSING_RANGES in reader_linker.skipped:
            # Sessions started and ended, the token count recorded; the range reads wait.
            assert reader_store._prefetched_tokens == 4 * 64
        else:
            for s_i, d_i in zip(range(4), range(4, 8)):
                assert np.array_equal(src.page(s_i), dst.page(d_i))
        # A page gone between lookup and load: the session start reports it.
        gone = storage._mha_meta(storage._tag_keys(pages[:1]), [0])[0][0]
        assert storage.store.remove(gone, force=True) == 0
        with pytest.raises(RuntimeError, match="session start failed"):
            reader_linker.load_layer_wise(pages, dst, [4, 5, 6, 7])
        assert reader_store.batch_get_session_end(
            reader._mha_meta(reader._tag_keys(pages), [4, 5, 6, 7])[0]) == 0
    finally:
        storage.store.close()
        reader_store.close()


def test_sglang_direct_linker_range_load(daemon, mooncake_store, prefix):
    """The direct linker's layer-wise load reads each layer's byte range of a page."""
    if not hasattr(mooncake_store.MooncakeDistributedStore,
                   "batch_get_into_multi_buffer_ranges"):
        pytest.skip(MISSING_RANGES)
    page_bytes, layers = 3 * 1024, 3
    src = SglangHostPool(4, page_bytes, fill=7)
    dst = SglangHostPool(4, page_bytes, fill=8)
    storage = SglangMooncakeStore(daemon.endpoint, src)
    reader = SglangMooncakeStore(daemon.endpoint, dst)
    try:
        linker = SglangDirectLinker(storage, layers, page_bytes)
        reader_linker = SglangDirectLinker(reader, layers, page_bytes)
        pages = [prefix + "rl%d" % i for i in range(2)]
        assert linker.offload(pages, [0, 1])
        reader_linker.load_layer_wise(pages, dst, [2, 3])
        assert reader_linker.skipped == []
        for s_i, d_i in ((0, 2), (1, 3)):
            assert np.array_equal(src.page(s_i), dst.page(d_i))
    finally:
        storage.store.close()
        reader.store.close()


class SglangSessionLinker(SglangDirectLinker):
    """The direct linker's session bookkeeping around the methods it probes with getattr
    (mooncake_direct_linker.py, 2026-09): the waiting-queue DFS prefetch capability
    (dfs_prefetch_arena_available / _status, then batch_get_session_prefetch of "dfs"
    sessions), sessions shared between requests by reference count (a reused session is
    refreshed before its count goes up), and revalidation before admission that skips the
    refresh of a private session younger than ratio x get_lease_ttl_ms() (the age taken from
    a monotonic time read before the call that leased it)."""

    def __init__(self, storage, num_layers, page_bytes, ratio=0.5, clock=None):
        super().__init__(storage, num_layers, page_bytes)
        self.ratio = ratio
        self.clock = clock or time.monotonic
        self.sessions, self.refcounts, self.sources, self.lease_base = {}, {}, {}, {}

    def host_prefetch_capability(self, requested=True):
        store = self.storage.store
        if not requested:
            return False, "disabled"
        available = getattr(store, "dfs_prefetch_arena_available", None)
        if available is None or not all(hasattr(store, name) for name in (
                "batch_get_session_start_with_sources", "batch_get_session_prefetch",
                "batch_get_session_refresh")):
            return False, "missing dfs_prefetch_arena_available"
        if not available():
            return False, "DFS prefetch arena %s (set MC_STORE_DFS_PREFETCH_ARENA_SIZE_BYTES)" % (
                store.dfs_prefetch_arena_status(),)
        return True, "ready"

    def prepare(self, rid, page_keys):
        store = self.storage.store
        keys = self.storage._mha_meta(self.storage._tag_keys(page_keys), [0] * len(page_keys))[0]
        reused = [k for k in keys if self.refcounts.get(k)]
        fresh = [k for k in keys if not self.refcounts.get(k)]
        if reused and list(store.batch_get_session_refresh(reused)) != [0] * len(reused):
            return False
        if fresh:
            base = self.clock()
            result, sources = store.batch_get_session_start_with_sources(fresh)
            if list(result) != [0] * len(fresh):
                ok = [k for k, r in zip(fresh, result) if r == 0]
                if ok:
                    store.batch_get_session_end(ok)
                return False
            for k, source in zip(fresh, sources):
                self.sources[k], self.lease_base[k] = source, base
        for k in reused:
            self.lease_base.pop(k, None)        # shared now: always refreshed
        for k in keys:
            self.refcounts[k] = self.refcounts.get(k, 0) + 1
        self.sessions[rid] = keys
        return True

    def host_prefetch(self, rid):
        dfs = [k for k in self.sessions[rid] if self.sources.get(k) == "dfs"]
        return not dfs or list(self.storage.store.batch_get_session_prefetch(dfs)) == \
            [0] * len(dfs)

    def revalidate(self, rid):
        store = self.storage.store
        keys = self.sessions[rid]
        getter = getattr(store, "get_lease_ttl_ms", None)
        ttl = getter() if getter is not None and self.ratio > 0 else None
        usable = type(ttl) is int and 0 < ttl < 2 ** 64
        bases = [self.lease_base.get(k) for k in keys]
        private = all(self.refcounts.get(k) == 1 for k in keys)
        if usable and private and None not in bases and \
                self.clock() - min(bases) < self.ratio * ttl / 1000.0:
            return True, False
        now = self.clock()
        if list(store.batch_get_session_refresh(keys)) != [0] * len(keys):
            for k in keys:
                self.lease_base.pop(k, None)
            return False, True
        for k in keys:
            if private:
                self.lease_base[k] = now
        return True, True

    def release(self, rid):
        ended = []
        for k in self.sessions.pop(rid, []):
            self.refcounts[k] -= 1
            if not self.refcounts[k]:
                del self.refcounts[k]
                self.lease_base.pop(k, None)
                ended.append(k)
        if ended:
            self.storage.store.batch_get_session_end(ended)


def test_sglang_direct_linker_sessions(daemon, mooncake_store, prefix):
    """The linker's probed session methods, as it uses them once getattr finds them."""
    page_bytes, layers = 3 * 1024, 3
    src = SglangHostPool(4, page_bytes, fill=1)
    storage = SglangMooncakeStore(daemon.endpoint, src)
    clock = [100.0]
    try:
        linker = SglangSessionLinker(storage, layers, page_bytes, clock=lambda: clock[0])
        store = storage.store
        ttl = store.get_lease_ttl_ms()
        assert ttl == 10000                       # kvpoold's --lease-ttl default
        # No DFS tier: the waiting-queue prefetch stays off, with the store's reason.
        enabled, reason = linker.host_prefetch_capability(True)
        assert not enabled and "not configured" in reason
        pages = [prefix + "sp%d" % i for i in range(3)]
        assert linker.offload(pages, [0, 1, 2])
        assert linker.prepare("r1", pages[:2])
        assert all(linker.sources[k] == "memory" for k in linker.sessions["r1"])
        assert linker.host_prefetch("r1")         # nothing "dfs": nothing to prefetch
        # A young private session skips the refresh; an old one refreshes.
        clock[0] += ttl / 1000 * 0.4
        assert linker.revalidate("r1") == (True, False)
        clock[0] += ttl / 1000 * 0.2
        assert linker.revalidate("r1") == (True, True)
        # A second request reuses page 1's sessions: refreshed, then shared (always refreshed).
        assert linker.prepare("r2", pages[1:])
        assert linker.revalidate("r2") == (True, True)
        assert store.batch_get_session_prefetch(linker.sessions["r2"]) == [0] * 4
        # A page removed under the session: the refresh fails and the linker falls back.
        gone = linker.sessions["r2"][2]
        assert store.remove(gone, force=True) == 0
        assert linker.revalidate("r2") == (False, True)
        linker.release("r1")
        linker.release("r2")
        assert linker.refcounts == {}
        assert store.batch_get_session_refresh(linker.storage._mha_meta(
            storage._tag_keys(pages), [0, 1, 2])[0]) == [-600] * 6
    finally:
        storage.store.close()


# ---- LMCache: MooncakestoreConnector ---------------------------------------------------------

METADATA_BYTES_LEN = 28


class LmcacheConnector:
    """MooncakestoreConnector's calls (mooncakestore_connector.py), asyncio and all."""

    def __init__(self, pinned_buffer, prefer_local_alloc):
        from mooncake.store import MooncakeDistributedStore, ReplicateConfig
        with open(os.environ["MOONCAKE_CONFIG_PATH"]) as fin:
            config = json.load(fin)
        self.config = config
        self.store = MooncakeDistributedStore()
        self.store.setup(config.get("local_hostname"), config.get("metadata_server"),
                         config.get("global_segment_size", 3355443200),
                         config.get("local_buffer_size", 1073741824),
                         config.get("protocol", "tcp"), config.get("device_name", ""),
                         config.get("master_server_address"))
        self.replica_config = ReplicateConfig()
        self.replica_config.replica_num = 1
        if prefer_local_alloc:
            self.replica_config.preferred_segment = self.store.get_hostname()
        self.buffer = pinned_buffer
        result = self.store.register_buffer(pinned_buffer.ctypes.data, pinned_buffer.size)
        self.registered_buffer_ptr = pinned_buffer.ctypes.data if result == 0 else None
        self.transfer_timeout = config.get("transfer_timeout", 1)

    async def exists(self, key):
        return self.store.is_exist(key)

    async def put_without_metadata(self, key, chunk):
        await asyncio.wait_for(asyncio.to_thread(self.store.put_from, key, chunk.ctypes.data,
                                                 chunk.nbytes, self.replica_config),
                               timeout=self.transfer_timeout)

    async def put_with_metadata(self, key, chunk, shape):
        metadata = struct.pack("<iiiiiii", len(chunk.tobytes()), *shape, 1, 0)
        assert len(metadata) == METADATA_BYTES_LEN
        await asyncio.wait_for(asyncio.to_thread(self.store.put_parts, key, metadata,
                                                 chunk.tobytes()),
                               timeout=self.transfer_timeout)

    async def batch_get_into(self, keys, chunk_bytes):
        views = [self.buffer[i * chunk_bytes:(i + 1) * chunk_bytes] for i in range(len(keys))]
        bytes_read = await asyncio.to_thread(self.store.batch_get_into, keys,
                                             [v.ctypes.data for v in views],
                                             [v.nbytes for v in views])
        return [v.tobytes()[:n] if n > 0 else None for v, n in zip(views, bytes_read)]

    async def batch_get_buffer(self, keys):
        buffers = await asyncio.to_thread(self.store.batch_get_buffer, keys)
        out = []
        for buffer in buffers:
            if buffer is None:
                out.append(None)
                continue
            view = memoryview(buffer)
            length = struct.unpack("<i", view[:4])[0]
            assert len(view) == length + METADATA_BYTES_LEN
            out.append(np.frombuffer(buffer, dtype=np.uint8, offset=METADATA_BYTES_LEN).copy())
        return out

    async def close(self):
        if self.registered_buffer_ptr is not None:
            assert self.store.unregister_buffer(self.registered_buffer_ptr) == 0
            self.registered_buffer_ptr = None
        self.store.close()


@pytest.mark.parametrize("prefer_local_alloc", [False, True])
def test_lmcache_connector(daemon, mooncake_store, tmp_path, monkeypatch, prefix,
                           prefer_local_alloc):
    write_config(tmp_path, monkeypatch, daemon.endpoint, local_hostname="lmcache-host",
                 global_segment_size=(16 << 20) if prefer_local_alloc else 0,
                 transfer_timeout=5, prefer_local_alloc=prefer_local_alloc)
    chunk_bytes = 8192
    rng = np.random.default_rng(9)
    chunks = [rng.integers(0, 255, chunk_bytes, dtype=np.uint8) for _ in range(4)]
    keys = ["vllm@Qwen3-8B@1@0@%s%d" % (prefix, i) for i in range(4)]

    async def run():
        writer = LmcacheConnector(np.zeros(4 * chunk_bytes, np.uint8), prefer_local_alloc)
        reader = LmcacheConnector(np.zeros(4 * chunk_bytes, np.uint8), False)
        try:
            assert not await reader.exists(keys[0])
            await writer.put_without_metadata(keys[0], chunks[0])
            await writer.put_without_metadata(keys[1], chunks[1])
            await writer.put_without_metadata(keys[1], chunks[1])   # again: no error
            assert await reader.exists(keys[0]) == 1
            got = await reader.batch_get_into(keys[:2] + [keys[3]], chunk_bytes)
            assert got[0] == chunks[0].tobytes() and got[1] == chunks[1].tobytes()
            assert got[2] is None                                   # n_read <= 0: a miss
            meta_keys = [k + "-meta" for k in keys[2:]]
            await writer.put_with_metadata(meta_keys[0], chunks[2], (2, 16, 8, 32))
            await writer.put_with_metadata(meta_keys[1], chunks[3], (2, 16, 8, 32))
            got = await reader.batch_get_buffer(meta_keys + [prefix + "nothing"])
            assert got[0].tobytes() == chunks[2].tobytes()
            assert got[1].tobytes() == chunks[3].tobytes() and got[2] is None
            if prefer_local_alloc:
                assert writer.replica_config.preferred_segment == writer.store.get_hostname()
                desc = writer.store.batch_get_replica_desc([keys[0]])[keys[0]][0]
                endpoint = desc.get_memory_descriptor().buffer_descriptor.transport_endpoint
                assert endpoint == writer.store.get_hostname()
        finally:
            await writer.close()
            await reader.close()
    asyncio.run(run())
