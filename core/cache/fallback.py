"""Redis that no request waits on or fails for: while it is down, caches miss and limits stay local.

Every use of Redis goes through `FallbackCache`, so a lost Redis is handled in this one place:

- reads miss (`get` is None, `list_range` is empty), writes and deletes are skipped (`set`
  is False, `delete` 0): callers rebuild from PostgreSQL, as after any expiry;
- token buckets and counters are kept in this process (the in-process cache's, which runs
  the same bucket as the Redis script), so rate limits still hold, per process;
- the outage is logged once when it starts and once when it ends, not per call; while it
  lasts no call tries Redis: a background probe pings it every ``retry_every`` seconds, and
  `ping` (the readiness check) tries at once;
- a key read or written while Redis could not be reached may hold something older than
  PostgreSQL once Redis answers again (Redis may have kept its data, but missed a write or a
  delete), so every such key is deleted before Redis is used again. Past ``max_stale``
  keys, every key under the prefix is dropped instead.

Nothing may depend on Redis for correctness (deduplication and locks live in PostgreSQL):
`set(..., only_if_absent=True)` answers False while Redis is down.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import TypeVar

from core.cache.local import LocalCache
from core.cache.redis import RedisCache
from core.errors import CacheUnavailable
from core.ports import BucketResult

log = logging.getLogger(__name__)

T = TypeVar("T")

RETRY_SECONDS = 1.0  # how often an unreachable Redis is tried again
MAX_STALE_KEYS = 100_000  # keys remembered for deletion; past this the whole prefix goes
_DELETE_BATCH = 500


class FallbackCache:
    """`Cache` on Redis that degrades to misses, skipped writes and in-process buckets."""

    def __init__(
        self,
        redis: RedisCache,
        *,
        retry_every: float = RETRY_SECONDS,
        max_stale: int = MAX_STALE_KEYS,
    ) -> None:
        self.kind = redis.kind
        self._redis = redis
        self._local = LocalCache()  # token buckets and counters while Redis is down
        self._retry_every = retry_every
        self._max_stale = max_stale
        self._down_since: float | None = None
        self._reason = ""
        self._stale: set[str] = set()
        self._stale_overflow = False
        self._recovering = asyncio.Lock()
        self._probe: asyncio.Task[None] | None = None

    @property
    def available(self) -> bool:
        """Whether calls go to Redis (False during an outage, until Redis answers again)."""
        return self._down_since is None

    # -- the Cache protocol ----------------------------------------------------------------

    async def get(self, key: str) -> str | None:
        return await self._call((key,), lambda: self._redis.get(key), None)

    async def set(
        self, key: str, value: str, ttl: float | None = None, *, only_if_absent: bool = False
    ) -> bool:
        return await self._call(
            (key,),
            lambda: self._redis.set(key, value, ttl, only_if_absent=only_if_absent),
            False,
        )

    async def delete(self, *keys: str) -> int:
        return await self._call(keys, lambda: self._redis.delete(*keys), 0)

    async def incr(self, key: str, amount: int = 1, ttl: float | None = None) -> int:
        if self._down_since is None:
            try:
                return await self._redis.incr(key, amount, ttl)
            except CacheUnavailable as exc:
                self._went_down(exc)
        return await self._local.incr(key, amount, ttl)

    async def take_token(
        self, key: str, *, rate: float, capacity: float, cost: float = 1.0
    ) -> BucketResult:
        if self._down_since is None:
            try:
                return await self._redis.take_token(key, rate=rate, capacity=capacity, cost=cost)
            except CacheUnavailable as exc:
                self._went_down(exc)
        # A bucket older in Redis than here has only refilled: it needs no deletion later.
        return await self._local.take_token(key, rate=rate, capacity=capacity, cost=cost)

    async def list_push(self, key: str, *values: str, keep: int, ttl: float | None) -> None:
        await self._call(
            (key,), lambda: self._redis.list_push(key, *values, keep=keep, ttl=ttl), None
        )

    async def list_range(self, key: str) -> list[str]:
        return await self._call((key,), lambda: self._redis.list_range(key), [])

    async def ping(self) -> None:
        """Raise `CacheUnavailable` while Redis cannot be used; during an outage, try now."""
        if self._down_since is not None:
            if not await self._recover():
                raise CacheUnavailable(self._reason)
            return
        try:
            await self._redis.ping()
        except CacheUnavailable as exc:
            self._went_down(exc)
            raise

    async def close(self) -> None:
        if self._probe is not None:
            self._probe.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._probe
            self._probe = None
        await self._local.close()
        await self._redis.close()

    # -- the outage ------------------------------------------------------------------------

    async def _call(self, keys: Iterable[str], call: Callable[[], Awaitable[T]], missed: T) -> T:
        if self._down_since is None:
            try:
                return await call()
            except CacheUnavailable as exc:
                self._went_down(exc)
        self._mark_stale(keys)
        return missed

    def _mark_stale(self, keys: Iterable[str]) -> None:
        if self._stale_overflow:
            return
        self._stale.update(keys)
        if len(self._stale) > self._max_stale:
            self._stale_overflow = True
            self._stale.clear()

    def _went_down(self, exc: CacheUnavailable) -> None:
        if self._down_since is not None:
            return
        self._down_since = time.monotonic()
        self._reason = exc.message
        log.warning(
            "cache.unavailable kind=%s reason=%r: caches bypassed, rate limits in-process "
            "until it answers again",
            self.kind,
            exc.message,
        )
        if self._probe is None or self._probe.done():
            self._probe = asyncio.create_task(self._probe_until_back())

    async def _probe_until_back(self) -> None:
        while self._down_since is not None:
            await asyncio.sleep(self._retry_every)
            try:
                await self._recover()
            except Exception:
                # Whatever went wrong, the probe keeps going: an outage must never latch.
                log.exception("cache.probe.failed kind=%s", self.kind)

    async def _recover(self) -> bool:
        """Ping Redis and delete the keys that may be stale; True once Redis is used again."""
        async with self._recovering:
            if self._down_since is None:
                return True
            try:
                await self._redis.ping()
                dropped = await self._drop_stale()
            except CacheUnavailable as exc:
                self._reason = exc.message
                return False
            # No await between the last deletion and this: no key can be marked in between.
            down_for = time.monotonic() - self._down_since
            self._down_since = None
            log.info(
                "cache.available kind=%s after_s=%.1f stale_keys_dropped=%s",
                self.kind,
                down_for,
                dropped,
            )
            return True

    async def _drop_stale(self) -> int | str:
        dropped = 0
        everything = False
        while self._stale or self._stale_overflow:
            if self._stale_overflow:
                # Keys marked while this runs are collected again and deleted next round.
                self._stale_overflow = False
                self._stale = set()
                await self._redis.clear()
                everything = True
                continue
            batch = list(itertools.islice(self._stale, _DELETE_BATCH))
            await self._redis.delete(*batch)
            # A key marked again meanwhile was only bypassed, never written: gone is right.
            self._stale.difference_update(batch)
            dropped += len(batch)
        return "all" if everything else dropped
