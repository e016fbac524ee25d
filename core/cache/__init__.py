"""The cache behind the `Cache` protocol: Redis when configured, else in-process."""

from __future__ import annotations

from core.cache.local import LocalCache
from core.cache.redis import RedisCache
from core.ports import Cache
from core.settings import Settings


async def open_cache(settings: Settings) -> Cache:
    """Connect to ``PARLEY_REDIS_URL`` (checked with a ping), else use the in-process cache."""
    if settings.redis_url is None:
        return LocalCache()
    cache = RedisCache.from_url(settings.redis_url.get_secret_value(), settings.redis_prefix)
    try:
        await cache.ping()
    except BaseException:
        await cache.close()
        raise
    return cache


__all__ = ["LocalCache", "RedisCache", "open_cache"]
