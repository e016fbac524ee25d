"""One behaviour suite for the `Cache` protocol, run against Redis and the in-process cache."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator

import pytest
import redis.asyncio as aioredis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from core.cache import FallbackCache, LocalCache, RedisCache
from core.errors import CacheUnavailable
from core.ports import Cache
from tests.support.redis_keys import key_prefix
from tests.support.services import RedisServer


def _redis_cache(url: str) -> RedisCache:
    # A prefix of its own keeps this test's keys apart from everything else on the server.
    client = aioredis.Redis.from_url(url, decode_responses=True)
    return RedisCache(client, prefix=key_prefix())


@pytest.fixture(params=["local", "redis", "fallback"])
async def cache(request: pytest.FixtureRequest, redis_url: str) -> AsyncIterator[Cache]:
    store: Cache
    if request.param == "local":
        store = LocalCache()
    elif request.param == "redis":
        store = _redis_cache(redis_url)
    else:  # what the processes use: Redis behind the fallback
        store = FallbackCache(_redis_cache(redis_url))
    yield store
    await store.close()


async def test_set_get_overwrite_and_missing(cache: Cache) -> None:
    assert await cache.get("greeting") is None
    assert await cache.set("greeting", "hallo")
    assert await cache.get("greeting") == "hallo"
    await cache.set("greeting", "hoi")
    assert await cache.get("greeting") == "hoi"


async def test_values_keep_unicode(cache: Cache) -> None:
    await cache.set("name", "Müller 🚚 — 東京")
    assert await cache.get("name") == "Müller 🚚 — 東京"


async def test_ttl_expires(cache: Cache) -> None:
    await cache.set("short", "x", ttl=0.2)
    await cache.set("long", "y", ttl=30)
    assert await cache.get("short") == "x"
    await asyncio.sleep(0.35)
    assert await cache.get("short") is None
    assert await cache.get("long") == "y"


async def test_only_if_absent(cache: Cache) -> None:
    assert await cache.set("lock", "a", ttl=10, only_if_absent=True)
    assert not await cache.set("lock", "b", ttl=10, only_if_absent=True)
    assert await cache.get("lock") == "a"


async def test_delete_counts_what_existed(cache: Cache) -> None:
    await cache.set("a", "1")
    await cache.set("b", "2")
    assert await cache.delete("a", "b", "never") == 2
    assert await cache.get("a") is None
    assert await cache.delete() == 0


async def test_incr_counts_and_ttl_set_only_at_creation(cache: Cache) -> None:
    assert await cache.incr("hits", ttl=0.3) == 1
    assert await cache.incr("hits", 5, ttl=30) == 6  # does not extend the first TTL
    await asyncio.sleep(0.45)
    assert await cache.incr("hits", ttl=30) == 1  # expired, started over


async def test_incr_without_ttl_persists(cache: Cache) -> None:
    assert await cache.incr("version") == 1
    assert await cache.incr("version") == 2
    assert await cache.get("version") == "2"


async def test_token_bucket_limits_and_refills(cache: Cache) -> None:
    results = [await cache.take_token("ip:1", rate=2.0, capacity=3) for _ in range(4)]
    assert [r.allowed for r in results] == [True, True, True, False]
    denied = results[-1]
    assert 0 < denied.retry_after <= 0.5
    assert denied.remaining < 1
    other = await cache.take_token("ip:2", rate=2.0, capacity=3)
    assert other.allowed  # buckets are independent
    await asyncio.sleep(denied.retry_after + 0.05)
    assert (await cache.take_token("ip:1", rate=2.0, capacity=3)).allowed


async def test_token_bucket_cost_larger_than_capacity_is_never_allowed(cache: Cache) -> None:
    result = await cache.take_token("big", rate=1.0, capacity=2, cost=5)
    assert not result.allowed
    assert result.retry_after == pytest.approx(3.0, abs=0.05)


async def test_list_keeps_the_newest_in_order(cache: Cache) -> None:
    assert await cache.list_range("recent") == []
    await cache.list_push("recent", "m1", "m2", keep=3, ttl=30)
    await cache.list_push("recent", "m3", "m4", keep=3, ttl=30)
    assert await cache.list_range("recent") == ["m2", "m3", "m4"]
    await cache.list_push("recent", "m5", keep=3, ttl=30)
    assert await cache.list_range("recent") == ["m3", "m4", "m5"]


async def test_list_push_refreshes_ttl(cache: Cache) -> None:
    await cache.list_push("recent", "a", keep=12, ttl=0.25)
    await asyncio.sleep(0.15)
    await cache.list_push("recent", "b", keep=12, ttl=0.25)
    await asyncio.sleep(0.15)
    assert await cache.list_range("recent") == ["a", "b"]
    await asyncio.sleep(0.2)
    assert await cache.list_range("recent") == []


async def test_ping_answers(cache: Cache) -> None:
    await cache.ping()


async def test_redis_gone_is_reported_as_cache_unavailable(private_redis: RedisServer) -> None:
    cache = _redis_cache(private_redis.url)
    await cache.set("k", "v")
    private_redis.stop()
    with pytest.raises(CacheUnavailable, match="redis is unreachable"):
        await cache.get("k")
    with pytest.raises(CacheUnavailable):
        await cache.ping()
    await cache.close()


async def _cut_off(redis: aioredis.Redis) -> None:
    """Redis refuses every other client but keeps its data, as behind a network partition."""
    await redis.config_set("requirepass", "partition")
    await redis.execute_command("CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes")


async def test_the_fallback_misses_skips_and_limits_in_process_while_redis_is_gone(
    private_redis: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    cache = FallbackCache(_redis_cache(private_redis.url))
    await cache.set("k", "v")
    await cache.list_push("recent", "a", keep=3, ttl=30)
    private_redis.kill()
    with caplog.at_level(logging.INFO, logger="core.cache.fallback"):
        for _ in range(3):  # however often it is asked: misses, skipped writes, no errors
            assert await cache.get("k") is None
            assert await cache.list_range("recent") == []
            assert not await cache.set("k", "w")
            assert not await cache.set("lock", "me", ttl=5, only_if_absent=True)
            await cache.list_push("recent", "b", keep=3, ttl=30)
            assert await cache.delete("k") == 0
        assert not cache.available
        assert [await cache.incr("n") for _ in range(2)] == [1, 2]
        taken = [await cache.take_token("ip", rate=0.001, capacity=2) for _ in range(3)]
        assert [t.allowed for t in taken] == [True, True, False]
        with pytest.raises(CacheUnavailable, match="redis is unreachable"):
            await cache.ping()
        private_redis.start()  # empty, on the same port
        await cache.ping()
        assert cache.available
        assert await cache.set("k", "again")
        assert await cache.get("k") == "again"
    logged = [r.getMessage().split(" ")[0] for r in caplog.records]
    assert logged == ["cache.unavailable", "cache.available"]  # once per outage, not per call
    await cache.close()


async def test_the_fallback_probes_redis_by_itself_until_it_is_back(
    private_redis: RedisServer,
) -> None:
    cache = FallbackCache(_redis_cache(private_redis.url), retry_every=0.02)
    private_redis.kill()
    assert await cache.get("k") is None
    assert not cache.available
    private_redis.start()
    async with asyncio.timeout(10):
        while not cache.available:  # no call to it needed: the probe finds Redis again
            await asyncio.sleep(0.02)
    assert await cache.set("k", "v")
    await cache.close()


async def test_keys_touched_while_cut_off_are_deleted_before_redis_is_used_again(
    private_redis: RedisServer,
) -> None:
    async with aioredis.Redis.from_url(private_redis.url, decode_responses=True) as admin:
        cache = FallbackCache(_redis_cache(private_redis.url))
        for key in ("pointer", "list", "kept"):
            await cache.set(key, "old")
        await _cut_off(admin)
        assert await cache.get("pointer") is None  # a read: what it held may be outdated now
        assert not await cache.set("list", "new")  # a write Redis never saw
        await admin.config_set("requirepass", "")
        await cache.ping()
        assert await cache.get("pointer") is None
        assert await cache.get("list") is None
        assert await cache.get("kept") == "old"  # untouched during the outage: still good
        await cache.close()


async def test_past_the_stale_key_limit_the_whole_prefix_is_dropped_and_nothing_else(
    private_redis: RedisServer,
) -> None:
    async with aioredis.Redis.from_url(private_redis.url, decode_responses=True) as admin:
        await admin.set("other-deployment:k", "theirs")
        cache = FallbackCache(_redis_cache(private_redis.url), max_stale=3)
        for n in range(10):
            await cache.set(f"k{n}", "old")
        await _cut_off(admin)
        for n in range(5):
            await cache.get(f"k{n}")
        await admin.config_set("requirepass", "")
        await cache.ping()
        assert [await cache.get(f"k{n}") for n in range(10)] == [None] * 10
        assert await admin.get("other-deployment:k") == "theirs"
        await cache.close()


# Counters and strings live under a-c, lists under x-z, as keys of one kind do in Parley.
_operations = st.lists(
    st.one_of(
        st.tuples(st.just("incr"), st.sampled_from("abc"), st.integers(-5, 5)),
        st.tuples(
            st.just("push"),
            st.sampled_from("xyz"),
            st.lists(st.text(max_size=5), max_size=4),
            st.integers(1, 4),
        ),
        st.tuples(st.just("set"), st.sampled_from("abc"), st.integers(0, 99)),
        st.tuples(st.just("delete"), st.sampled_from("abcxyz")),
    ),
    max_size=25,
)


async def _apply(cache: Cache, operations: list[tuple[object, ...]]) -> list[object]:
    seen: list[object] = []
    for op in operations:
        kind, key = op[0], f"k:{op[1]}"
        if kind == "incr":
            seen.append(await cache.incr(key, int(op[2])))  # type: ignore[call-overload]
        elif kind == "push":
            await cache.list_push(key, *op[2], keep=int(op[3]), ttl=60)  # type: ignore[misc, call-overload]
            seen.append(await cache.list_range(key))
        elif kind == "set":
            seen.append(await cache.set(key, str(op[2])))
        else:
            seen.append(await cache.delete(key))
    return seen


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(operations=_operations)
def test_redis_and_local_give_the_same_answers(
    redis_url: str, operations: list[tuple[object, ...]]
) -> None:
    async def both() -> tuple[list[object], list[object]]:
        redis_cache = _redis_cache(redis_url)
        try:
            return await _apply(LocalCache(), operations), await _apply(redis_cache, operations)
        finally:
            await redis_cache.close()

    local, remote = asyncio.run(both())
    assert local == remote
