"""The resources a process works with, opened and closed together for CLI commands and workers."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import aiohttp

from core.cache import open_cache
from core.llm.limits import ModelLimits
from core.ports import Cache, Embedder
from core.retrieval.embedders import EmbedderIdentity, close_embedder, open_embedder
from core.settings import Settings
from core.store import Database, open_database
from core.store.vector_index import check_embedders

HTTP_TIMEOUT = aiohttp.ClientTimeout(total=60, connect=10)


@dataclass(frozen=True)
class Runtime:
    settings: Settings
    database: Database
    cache: Cache
    embedder: Embedder
    http: aiohttp.ClientSession
    # One per process: every pipeline it builds counts the agents' model calls together.
    model_limits: ModelLimits = field(default_factory=ModelLimits)
    # Set when this process queues a reply: its outbox sender sends it without waiting to poll.
    outbox_queued: asyncio.Event = field(default_factory=asyncio.Event)


@asynccontextmanager
async def open_runtime(
    settings: Settings, *, check_index: bool = True, pool_size: int = 4
) -> AsyncIterator[Runtime]:
    """Database (migrated), cache and embedder; refuses a mismatched embedder unless told not to
    (rebuild-index is the command that fixes a mismatch, so it must be able to start)."""
    embedder = await open_embedder(settings)
    try:
        database = await open_database(settings, max_size=pool_size)
        try:
            if check_index:
                async with database.pool.acquire() as conn:
                    await check_embedders(conn, EmbedderIdentity.of(embedder))
            cache = await open_cache(settings)
            try:
                async with aiohttp.ClientSession(timeout=HTTP_TIMEOUT) as http:
                    yield Runtime(settings, database, cache, embedder, http)
            finally:
                await cache.close()
        finally:
            await database.close()
    finally:
        await close_embedder(embedder)
