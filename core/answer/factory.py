"""Assembling the answer pipeline from the settings and the open resources."""

from __future__ import annotations

import aiohttp
import asyncpg

from core.answer.pipeline import AnswerPipeline, PipelineConfig
from core.answer.rewrite import QueryRewriter
from core.ports import Cache, ChatModel, Embedder
from core.retrieval.retriever import build_retriever
from core.settings import Settings
from core.store.agents import Agents
from core.store.conversations import Conversations
from core.store.curated import CuratedAnswers


def build_pipeline(
    settings: Settings,
    pool: asyncpg.Pool,
    cache: Cache,
    embedder: Embedder,
    session: aiohttp.ClientSession,
    chat: ChatModel | None,
    agents: Agents | None = None,
) -> AnswerPipeline:
    config = PipelineConfig(
        rewrite_model=settings.rewrite_model, rewrite_timeout_ms=settings.rewrite_timeout_ms
    )
    return AnswerPipeline(
        agents=agents or Agents(pool),
        conversations=Conversations(pool),
        curated=CuratedAnswers(pool),
        retriever=build_retriever(settings, pool, embedder, cache, session),
        embedder=embedder,
        chat=chat,
        rewriter=QueryRewriter(
            chat, cache, model=settings.rewrite_model, timeout_ms=settings.rewrite_timeout_ms
        ),
        config=config,
    )
