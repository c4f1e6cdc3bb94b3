"""The Mooncake drop-in's upsert family and ranged reads (kvpool's UPSERT and ranged GET),
with numpy buffers standing in for tensors, tenants kept apart."""

import numpy as np
import pytest

from test_mooncake_methods import make_store

INVALID_PARAMS = -600
INVALID_KEY = -400


@pytest.fixture
def store(daemon):
    s = make_store(daemon.endpoint)
    yield s
    s.close()


def test_upsert_family(store, prefix):
    k = prefix + "u"
    assert store.upsert(k, b"first") == 0
    assert store.put(k, b"ignored") == 0            # Mooncake: an existing key is success...
    assert store.get(k) == b"first"                 # ... and the first value stays
    assert store.upsert(k, b"second value") == 0
    assert store.get(k) == b"second value"
    buf = np.frombuffer(b"from a buffer", dtype=np.uint8).copy()
    assert store.upsert_from(k, buf.ctypes.data, buf.nbytes) == 0
    assert store.get(k) == b"from a buffer"
    assert store.upsert_parts(k, b"ab", b"cd") == 0
    assert store.get(k) == b"abcd"
    assert store.upsert(k, b"") == INVALID_PARAMS
    assert store.upsert("", b"x") == INVALID_KEY
    a = np.full(1000, 7, dtype=np.uint8)
    b = np.full(2000, 9, dtype=np.uint8)
    keys = [k, prefix + "v", ""]
    assert store.batch_upsert_from(keys, [a.ctypes.data, b.ctypes.data, a.ctypes.data],
                                   [a.nbytes, b.nbytes, a.nbytes]) == [0, 0, INVALID_KEY]
    assert store.get(k) == a.tobytes() and store.get(prefix + "v") == b.tobytes()
    assert store.upsert_batch([k, prefix + "v"], [b"x", b"yy"]) == 0
    assert store.get_batch([k, prefix + "v"]) == [b"x", b"yy"]


def test_batch_get_into_multi_buffer_ranges(store, prefix):
    page = np.arange(4096, dtype=np.uint8)
    assert store.put(prefix + "p0", page) == 0
    assert store.put(prefix + "p1", page[::-1].copy()) == 0
    out = np.zeros(4 * 1024, dtype=np.uint8)
    base = out.ctypes.data
    results = store.batch_get_into_multi_buffer_ranges(
        [prefix + "p0", prefix + "p1", prefix + "nope"],
        [[base, base + 1024], [base + 2048], [base + 3072]],
        [[512, 256], [1024], [16]],
        [[0, 3000], [100], [0]])
    assert results[:2] == [768, 1024] and results[2] < 0
    assert (out[:512] == page[:512]).all()
    assert (out[1024:1280] == page[3000:3256]).all()
    assert (out[2048:3072] == page[::-1][100:1124]).all()
    # A range past the value's end is refused, not read short.
    assert store.batch_get_into_multi_buffer_ranges([prefix + "p0"], [[base]], [[100]],
                                                    [[4090]]) == [INVALID_PARAMS]
    # Shapes that disagree.
    assert store.batch_get_into_multi_buffer_ranges([prefix + "p0"], [[base, base]], [[1]],
                                                    [[0]]) == [INVALID_PARAMS]


def test_get_into_ranges(store, prefix):
    value = np.arange(10000, dtype=np.uint16).view(np.uint8)
    assert store.put(prefix + "r", value) == 0
    assert store.put(prefix + "s", b"0123456789") == 0
    one, two = np.zeros(64, dtype=np.uint8), np.zeros(64, dtype=np.uint8)
    results = store.get_into_ranges(
        [one.ctypes.data, two.ctypes.data],
        [[prefix + "r", prefix + "s"], [prefix + "nope"]],
        [[[0, 32], [40]], [[0]]],
        [[[2, 19998], [3]], [[0]]],
        [[[8, 2], [4]], [[4]]])
    assert results[0] == [[8, 2], [4]] and results[1][0][0] < 0
    assert one[:8].tobytes() == value[2:10].tobytes()
    assert one[32:34].tobytes() == value[19998:20000].tobytes()
    assert one[40:44].tobytes() == b"3456"


def test_ranges_and_upserts_stay_in_their_tenant(daemon, prefix):
    a = make_store(daemon.endpoint, tenant_id="alpha")
    b = make_store(daemon.endpoint, tenant_id="beta")
    try:
        assert a.upsert(prefix + "t", b"alpha's") == 0
        assert b.upsert(prefix + "t", b"beta's!") == 0
        assert a.get(prefix + "t") == b"alpha's" and b.get(prefix + "t") == b"beta's!"
        buf = np.zeros(8, dtype=np.uint8)
        assert b.batch_get_into_multi_buffer_ranges([prefix + "t"], [[buf.ctypes.data]], [[4]],
                                                    [[3]]) == [4]
        assert buf[:4].tobytes() == b"a's!"
    finally:
        a.close()
        b.close()
