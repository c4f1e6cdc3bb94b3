"""kvpool.Client's upsert and range reads, on the same-machine path and over tcp."""

import pytest

import kvpool


@pytest.fixture(params=[True, False], ids=["same-machine", "tcp"])
def pool(client, request):
    client.fast_path = request.param
    return client


def test_upsert_replaces_and_creates(pool, prefix):
    key = prefix + "k"
    pool.upsert(key, b"one")
    with pytest.raises(kvpool.ObjectAlreadyExistsError):
        pool.put(key, b"two")
    pool.upsert(key, b"second value, longer")
    assert pool.get(key) == b"second value, longer"
    pool.upsert_parts(key, b"ab", b"cd")
    assert pool.get(key) == b"abcd"
    assert pool.upsert_batch_parts([key, prefix + "j", ""], [[b"x"], [b"y", b"z"], [b"w"]]) == \
        [0, 0, kvpool.Status.INVALID_KEY]
    assert pool.get(prefix + "j") == b"yz" and pool.get(key) == b"x"


def test_ranges(pool, prefix):
    value = bytes(range(256)) * 1000
    pool.put(prefix + "big", value)
    buf = bytearray(100)
    assert pool.get_range_into(prefix + "big", 300, buf) == 100
    assert bytes(buf) == value[300:400]
    bufs = [bytearray(10), bytearray(10), bytearray(5)]
    assert pool.get_ranges_into([prefix + "big", prefix + "nope", prefix + "big"],
                                [len(value) - 4, 0, len(value)], bufs) == \
        [4, kvpool.Status.OBJECT_NOT_FOUND, 0]
    assert bytes(bufs[0][:4]) == value[-4:]
    with pytest.raises(kvpool.InvalidParamsError):
        pool.get_range_into(prefix + "big", len(value) + 1, buf)
    with pytest.raises(kvpool.ObjectNotFoundError):
        pool.get_range_into(prefix + "nope", 0, buf)
