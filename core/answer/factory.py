"""Assembling the answer pipeline from the settings and the open resources."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime

import aiohttp
import asyncpg

from core.answer.answer_cache import AnswerCache
from core.answer.explore import Explorer
from core.answer.pipeline import AnswerPipeline, PipelineConfig
from core.answer.quotas import Quotas
from core.answer.rewrite import QueryRewriter
from core.answer.translate import build_translator
from core.llm.limits import ModelLimits
from core.memory import build_memory
from core.ports import Cache, ChatModel, Embedder
from core.retrieval.retriever import build_retriever
from core.settings import Settings
from core.store.agents import Agents
from core.store.conversations import Conversations
from core.store.curated import CuratedAnswers
from core.store.handoff import HandoffStore
from core.store.page_catalog import PageCatalog
from core.store.piece_vectors import PieceVectors


def _ms(seconds: float) -> int:
    return round(seconds * 1000)


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
    timeouts = settings.llm_timeouts
    config = config or PipelineConfig(
        rewrite_model=settings.rewrite_model,
        rewrite_timeout_ms=_ms(timeouts.rewrite),
        critic_model=settings.critic_model,
        critic_timeout_ms=_ms(timeouts.critic),
    )
    retriever = build_retriever(settings, pool, embedder, cache, session)
    return AnswerPipeline(
        agents=agents or Agents(pool),
        conversations=Conversations(pool),
        memory=build_memory(settings, pool, cache, chat),
        curated=CuratedAnswers(pool),
        retriever=retriever,
        embedder=embedder,
        chat=chat,
        rewriter=QueryRewriter(
            chat, cache, model=settings.rewrite_model, timeout_ms=_ms(timeouts.rewrite)
        ),
        config=config,
        clock=clock,
        handoff=HandoffStore(pool),
        limits=limits,
        translator=build_translator(settings, chat, cache, retriever),
        answer_cache=AnswerCache(
            cache,
            embedder,
            enabled=settings.answer_cache,
            similarity=settings.answer_cache_similarity,
            ttl=settings.answer_cache_ttl_seconds,
            model=chat.model if chat is not None else "",
        ),
        quotas=Quotas(
            pool,
            cache,
            visitor_day=settings.quota_visitor_day,
            agent_month=settings.quota_agent_month,
            address_share=settings.quota_address_share,
        ),
        explorer=(
            Explorer(
                PageCatalog(pool),
                retriever,
                chat,
                max_tokens=config.max_tokens,
                temperature=config.temperature,
            )
            if chat is not None
            else None
        ),
        pieces=PieceVectors(pool),
    )
