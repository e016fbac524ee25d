"""The cache behind the `Cache` protocol: Redis when configured, else in-process."""

from __future__ import annotations

import contextlib

from core.cache.fallback import FallbackCache
from core.cache.local import LocalCache
from core.cache.redis import RedisCache
from core.errors import CacheUnavailable
from core.ports import Cache
from core.settings import Settings


async def open_cache(settings: Settings) -> Cache:
    """``PARLEY_REDIS_URL`` behind `FallbackCache`, else the in-process cache.

    A Redis that does not answer at start-up is no reason not to start: the process starts
    without it (the outage is logged once) and uses it from the moment it answers.
    """
    if settings.redis_url is None:
        return LocalCache()
    redis = RedisCache.from_url(settings.redis_url.get_secret_value(), settings.redis_prefix)
    cache = FallbackCache(redis)
    with contextlib.suppress(CacheUnavailable):
        await cache.ping()
    return cache


__all__ = ["FallbackCache", "LocalCache", "RedisCache", "open_cache"]
