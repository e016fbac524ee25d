"""Many chats at once: turns waiting on a slow model hold no work slot; an agent's limit holds.

The real pipeline answers with the real OpenAI client against the local fake model, which
counts the requests it is answering at once.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestServer

from channels.registry import BY_NAME
from core.answer.factory import build_pipeline
from core.answer.pipeline import AnswerPipeline
from core.cache import RedisCache
from core.jobs.inbox_worker import InboxWorker
from core.knowledge.ingest import Ingestor
from core.knowledge.sources import parse_source
from core.llm.limits import ModelLimits
from core.llm.openai_chat import OpenAIChatModel
from core.retrieval.embedders import UseEmbedder
from core.settings import Settings
from core.store import Agent, Agents, Database
from core.store.inbox import Inbox
from core.store.knowledge import KnowledgeStore
from core.store.vector_index import EmbedderIdentity
from tests.fakes.openai import FakeOpenAI
from tests.integration.test_inbox_worker import Running
from tests.support.deliveries import add_delivery
from tests.support.waiting import wait_until

PAGES = [
    {"url": "https://shop.example/en/shipping", "title": "Shipping", "lang": "en",
     "text": "# Shipping\nOrders to Belgium arrive in 2-3 working days."},
]  # fmt: skip
ANSWER = "Orders to Belgium arrive in 2-3 working days [1]."


@dataclass
class Crowd:
    database: Database
    agents: Agents
    agent: Agent
    model: FakeOpenAI
    pipeline: AnswerPipeline
    limits: ModelLimits
    inbox: Inbox

    def worker(self, **options: Any) -> InboxWorker:
        values: dict[str, Any] = {
            "burst_window": 0.0,
            "lease": 5.0,
            "poll_interval": 0.05,
            "concurrency": 64,
            "cpu_slots": 4,
            "limits": self.limits,
            "channels": BY_NAME,
            "memory": self.pipeline.memory,
            "holding_after": 0,
        }
        return InboxWorker(self.database.pool, self.pipeline, **{**values, **options})

    async def write(self, chats: int) -> None:
        """One message from each of ``chats`` customers."""
        for number in range(chats):
            sid = f"SM{number:032d}"
            customer = f"whatsapp:+3161{number:07d}"
            payload = {"MessageSid": sid, "From": customer, "NumMedia": "0",
                       "Body": "How long does delivery to Belgium take?"}  # fmt: skip
            assert await add_delivery(self.inbox, self.agent.id, "whatsapp", sid, customer, payload)

    async def all_done(self) -> bool:
        rows = await self.database.pool.fetch("SELECT status FROM inbox")
        return bool(rows) and all(r["status"] == "done" for r in rows)


@pytest.fixture
async def crowd(
    settings: Settings,
    database: Database,
    use_embedder: UseEmbedder,
    cache: RedisCache,
    tmp_path: Path,
) -> AsyncIterator[Crowd]:
    agents = Agents(database.pool)
    agent = await agents.create("shop", embedder=EmbedderIdentity.of(use_embedder))
    # Every customer asks the same question: measured here is how many turns reach the
    # model at once, so none may be answered from the answer cache.
    agent = await agents.update("shop", settings={"answer_cache": False})
    path = tmp_path / "pages.jsonl"
    path.write_text("\n".join(json.dumps(p) for p in PAGES), encoding="utf-8")
    await Ingestor(KnowledgeStore(database.pool), use_embedder).ingest(
        agent, parse_source(str(path))
    )
    model = FakeOpenAI(default_reply=ANSWER)
    server = TestServer(model.app())
    await server.start_server()
    chat = OpenAIChatModel(
        "gpt-test", api_key="sk-test", base_url=str(server.make_url("/v1")), total_timeout=30.0
    )
    limits = ModelLimits()
    async with aiohttp.ClientSession() as session:
        pipeline = build_pipeline(
            settings, database.pool, cache, use_embedder, session, chat, agents, limits=limits
        )
        yield Crowd(database, agents, agent, model, pipeline, limits, Inbox(database.pool))
        await pipeline.memory.drain()
    await chat.close()
    await server.close()


@pytest.fixture
async def running() -> AsyncIterator[Running]:
    services = Running()
    yield services
    await services.stop()


async def test_turns_waiting_on_the_model_hold_no_work_slot(crowd: Crowd, running: Running) -> None:
    # Slow enough that every turn is still waiting when the last one reaches the model.
    crowd.model.first_token_delay = 3.0
    await crowd.write(30)
    worker = crowd.worker()
    running.start(worker.run())

    async def many_at_once() -> bool:
        return crowd.model.most_chats_in_flight >= 20

    await wait_until(many_at_once)  # with only 4 work slots
    await wait_until(crowd.all_done)
    assert len(crowd.model.turn_requests) == 30


async def test_the_process_concurrency_caps_the_turns_in_flight(
    crowd: Crowd, running: Running
) -> None:
    crowd.model.first_token_delay = 0.3
    await crowd.write(12)
    running.start(crowd.worker(concurrency=5).run())
    await wait_until(crowd.all_done)
    assert len(crowd.model.turn_requests) == 12
    assert 1 < crowd.model.most_chats_in_flight <= 5


async def test_an_agents_model_concurrency_caps_its_turns(crowd: Crowd, running: Running) -> None:
    crowd.model.first_token_delay = 0.3
    await crowd.agents.update("shop", settings={**crowd.agent.settings, "llm_concurrency": 3})
    await crowd.write(12)
    running.start(crowd.worker().run())
    await wait_until(crowd.all_done)
    assert len(crowd.model.turn_requests) == 12
    assert crowd.model.most_chats_in_flight == 3
