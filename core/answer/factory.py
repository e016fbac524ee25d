"""Assembling the answer pipeline from the settings and the open resources."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime

import aiohttp
import asyncpg

from core.answer.pipeline import AnswerPipeline, PipelineConfig
from core.answer.rewrite import QueryRewriter
from core.llm.limits import ModelLimits
from core.memory import build_memory
from core.ports import Cache, ChatModel, Embedder
from core.retrieval.retriever import build_retriever
from core.settings import Settings
from core.store.agents import Agents
from core.store.conversations import Conversations
from core.store.curated import CuratedAnswers
from core.store.handoff import HandoffStore


def build_pipeline(
    settings: Settings,
    pool: asyncpg.Pool,
    cache: Cache,
    embedder: Embedder,
    session: aiohttp.ClientSession,
    chat: ChatModel | None,
    agents: Agents | None = None,
    clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    config: PipelineConfig | None = None,
    limits: ModelLimits | None = None,
) -> AnswerPipeline:
    """``limits``: the process's per-agent model limits, shared by every pipeline it builds
    (each gets its own without)."""
    config = config or PipelineConfig(
        rewrite_model=settings.rewrite_model, rewrite_timeout_ms=settings.rewrite_timeout_ms
    )
    return AnswerPipeline(
        agents=agents or Agents(pool),
        conversations=Conversations(pool),
        memory=build_memory(settings, pool, cache, chat),
        curated=CuratedAnswers(pool),
        retriever=build_retriever(settings, pool, embedder, cache, session),
        embedder=embedder,
        chat=chat,
        rewriter=QueryRewriter(
            chat, cache, model=settings.rewrite_model, timeout_ms=settings.rewrite_timeout_ms
        ),
        config=config,
        clock=clock,
        handoff=HandoffStore(pool),
        limits=limits,
    )
