"""The composition root: what a process works with, opened once and closed together.

`open_runtime` opens the resources (database, cache, embedder, HTTP session, the one agent
cache); `open_answering` builds on them what answers and sends (the chat model, the one
answer pipeline, the channel senders, voice transcription). `parley serve` (the app and its
in-process workers), `parley worker` and the CLI commands all come here, so each process
builds each of them once and its parts share them.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import aiohttp

from channels.registry import secret_fields
from core.answer.factory import build_pipeline
from core.answer.pipeline import AnswerPipeline
from core.cache import open_cache
from core.llm.limits import ModelLimits
from core.llm.openai_chat import close_chat_model, open_chat_model
from core.ports import Cache, ChatModel, Embedder
from core.retrieval.embedders import close_embedder, open_embedder
from core.settings import Settings
from core.store import Database, open_database
from core.store.agents import Agents
from core.store.vector_index import EmbedderIdentity, check_embedders
from gateway.intake import IntakeGauge
from gateway.senders import AgentSenders
from gateway.voice import VoiceNotes, open_voice_notes

HTTP_TIMEOUT = aiohttp.ClientTimeout(total=60, connect=10)
# Agents are looked up on every turn; a change made in another process applies within this
# many seconds (one made through this process's admin API, at once).
AGENT_FRESH_SECONDS = 5.0
# Summaries still being written at shutdown get this long; the catch-up job does the rest.
SUMMARY_DRAIN_SECONDS = 5.0


@dataclass(frozen=True)
class Runtime:
    settings: Settings
    database: Database
    cache: Cache
    embedder: Embedder
    http: aiohttp.ClientSession
    # One per process, with one expiry: the app, its workers and the admin API share it.
    agents: Agents
    # One per process: every pipeline it builds counts the agents' model calls together.
    model_limits: ModelLimits = field(default_factory=ModelLimits)
    # Set when this process queues a reply: its outbox sender sends it without waiting to poll.
    outbox_queued: asyncio.Event = field(default_factory=asyncio.Event)
    # The webhooks this process is acknowledging: its workers start no turn while one waits.
    intake: IntakeGauge = field(default_factory=IntakeGauge)


@dataclass(frozen=True)
class Answering:
    """The answer side of a process, on its `Runtime`."""

    runtime: Runtime
    chat: ChatModel | None
    pipeline: AnswerPipeline
    senders: AgentSenders
    voice: VoiceNotes


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
                    agents = Agents(
                        database.pool,
                        fresh_for=AGENT_FRESH_SECONDS,
                        secret_fields=secret_fields(),
                    )
                    yield Runtime(settings, database, cache, embedder, http, agents)
            finally:
                await cache.close()
        finally:
            await database.close()
    finally:
        await close_embedder(embedder)


@asynccontextmanager
async def open_answering(runtime: Runtime) -> AsyncIterator[Answering]:
    """The chat model, the answer pipeline, the senders and voice transcription, closed in
    order: summaries still being written get `SUMMARY_DRAIN_SECONDS`."""
    settings = runtime.settings
    chat = open_chat_model(settings)
    try:
        pipeline = build_pipeline(
            settings,
            runtime.database.pool,
            runtime.cache,
            runtime.embedder,
            runtime.http,
            chat,
            runtime.agents,
            limits=runtime.model_limits,
        )
        senders = AgentSenders(settings, runtime.agents)
        voice = open_voice_notes(settings, runtime.agents)
        try:
            yield Answering(runtime, chat, pipeline, senders, voice)
        finally:
            try:
                await pipeline.memory.drain(within=SUMMARY_DRAIN_SECONDS)
            finally:
                await senders.close()
                await voice.close()
    finally:
        if chat is not None:
            await close_chat_model(chat)
