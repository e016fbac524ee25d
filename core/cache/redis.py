"""The Redis-backed cache, shared by every gateway and worker process."""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialWithJitterBackoff
from redis.exceptions import RedisError

from core.errors import CacheUnavailable
from core.ports import BucketResult

# Refill and take in one round trip, on Redis' clock so that processes agree.
_BUCKET_SCRIPT = """
local rate = tonumber(ARGV[1])
local capacity = tonumber(ARGV[2])
local cost = tonumber(ARGV[3])
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local state = redis.call('HMGET', KEYS[1], 'tokens', 'ts')
local tokens = tonumber(state[1]) or capacity
local ts = tonumber(state[2]) or now
tokens = math.min(capacity, tokens + math.max(0, now - ts) * rate)
local allowed = 0
local retry = 0
if tokens >= cost then
  tokens = tokens - cost
  allowed = 1
else
  retry = (cost - tokens) / rate
end
redis.call('HSET', KEYS[1], 'tokens', tostring(tokens), 'ts', tostring(now))
redis.call('PEXPIRE', KEYS[1], math.ceil((capacity / rate + 1) * 1000))
return {allowed, tostring(tokens), tostring(retry)}
"""


@contextmanager
def _reachable() -> Iterator[None]:
    """Report a lost Redis as `CacheUnavailable`, never as a redis-py exception."""
    try:
        yield
    except (RedisError, OSError) as exc:
        raise CacheUnavailable(f"redis is unreachable ({type(exc).__name__})") from exc


def _glob_escape(text: str) -> str:
    """``text`` matched literally by a Redis glob pattern (SCAN MATCH)."""
    return "".join("\\" + c if c in "*?[]\\" else c for c in text)


def _ms(ttl: float) -> int:
    return max(1, math.ceil(ttl * 1000))


class RedisCache:
    """`Cache` on a Redis server; every key gets ``prefix`` so one server can be shared."""

    kind = "redis"

    def __init__(self, client: aioredis.Redis, prefix: str = "parley:") -> None:
        self._client = client
        self._prefix = prefix
        self._bucket = client.register_script(_BUCKET_SCRIPT)

    @classmethod
    def from_url(cls, url: str, prefix: str = "parley:") -> RedisCache:
        # Short timeouts and one retry: a retry reconnects a pooled connection that a Redis
        # restart closed, and more only delays the calls in flight when Redis goes, which
        # then answer without it (see `FallbackCache`).
        client = aioredis.Redis.from_url(
            url,
            decode_responses=True,
            socket_connect_timeout=1.0,
            socket_timeout=2.0,
            retry=Retry(ExponentialWithJitterBackoff(cap=0.1, base=0.01), retries=1),
        )
        return cls(client, prefix)

    def _key(self, key: str) -> str:
        return self._prefix + key

    async def get(self, key: str) -> str | None:
        with _reachable():
            value = await self._client.get(self._key(key))
            return None if value is None else str(value)

    async def set(
        self, key: str, value: str, ttl: float | None = None, *, only_if_absent: bool = False
    ) -> bool:
        with _reachable():
            done = await self._client.set(
                self._key(key), value, px=None if ttl is None else _ms(ttl), nx=only_if_absent
            )
            return bool(done)

    async def delete(self, *keys: str) -> int:
        with _reachable():
            if not keys:
                return 0
            return int(await self._client.delete(*(self._key(k) for k in keys)))

    async def incr(self, key: str, amount: int = 1, ttl: float | None = None) -> int:
        with _reachable():
            full = self._key(key)
            async with self._client.pipeline(transaction=True) as pipe:
                pipe.incrby(full, amount)
                if ttl is not None:
                    pipe.pexpire(full, _ms(ttl), nx=True)
                result: list[Any] = await pipe.execute()
            return int(result[0])

    async def take_token(
        self, key: str, *, rate: float, capacity: float, cost: float = 1.0
    ) -> BucketResult:
        with _reachable():
            allowed, remaining, retry = await self._bucket(
                keys=[self._key(key)], args=[rate, capacity, cost]
            )
            return BucketResult(
                allowed=bool(allowed), remaining=float(remaining), retry_after=float(retry)
            )

    async def list_push(self, key: str, *values: str, keep: int, ttl: float | None) -> None:
        with _reachable():
            full = self._key(key)
            async with self._client.pipeline(transaction=True) as pipe:
                if values:
                    pipe.rpush(full, *values)
                if keep > 0:
                    pipe.ltrim(full, -keep, -1)
                else:
                    pipe.delete(full)
                if ttl is not None:
                    pipe.pexpire(full, _ms(ttl))
                await pipe.execute()

    async def list_range(self, key: str) -> list[str]:
        with _reachable():
            items = await self._client.lrange(self._key(key), 0, -1)
            return [str(item) for item in items]

    async def clear(self) -> int:
        """Delete every key under this cache's prefix (and no other); returns how many."""
        removed = 0
        with _reachable():
            batch: list[str] = []
            async for key in self._client.scan_iter(
                match=_glob_escape(self._prefix) + "*", count=500
            ):
                batch.append(key)
                if len(batch) >= 500:
                    removed += int(await self._client.unlink(*batch))
                    batch = []
            if batch:
                removed += int(await self._client.unlink(*batch))
        return removed

    async def ping(self) -> None:
        with _reachable():
            await self._client.ping()

    async def close(self) -> None:
        await self._client.aclose()
