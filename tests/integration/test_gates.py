"""The answer gates through the real pipeline: the openai client against the fake model, a
real database and Redis. What the visitor is sent, what is stored, what the trace says."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from core.answer.factory import build_pipeline
from core.answer.phrases import deferral
from core.cache import RedisCache
from core.knowledge.ingest import Ingestor
from core.knowledge.sources import parse_source
from core.llm.openai_chat import OpenAIChatModel
from core.retrieval.embedders import UseEmbedder
from core.store import Agents, Database
from core.store.knowledge import KnowledgeStore
from core.turns import CollectingTurnOutput
from tests.conftest import MakeSettings
from tests.fakes.openai import FakeOpenAI
from tests.integration.test_pipeline import MODEL, Rig, _shop, fake

__all__ = ["fake"]  # the fake model's fixture, shared with the pipeline's tests

CRITIC = "critic-test"
QUESTION = "How long does delivery to Belgium take?"
GOOD = "Parcels to Belgium take 2-3 working days [1]."


@pytest.fixture
async def rig(
    fake: tuple[FakeOpenAI, str],
    make_settings: MakeSettings,
    database: Database,
    use_embedder: UseEmbedder,
    cache: RedisCache,
    tmp_path: Path,
) -> AsyncIterator[Rig]:
    server, url = fake
    settings = make_settings(
        llm_base_url=url, llm_api_key="sk-test", llm_model=MODEL, critic_model=CRITIC,
        summary_model="summary-test", answer_cache=False,
    )  # fmt: skip
    agent = await _shop(database, use_embedder, tmp_path)
    chat = OpenAIChatModel(MODEL, api_key="sk-test", base_url=url)
    async with aiohttp.ClientSession() as session:
        pipeline = build_pipeline(settings, database.pool, cache, use_embedder, session, chat)
        yield Rig(server, pipeline, database, agent, settings)
        await pipeline.memory.drain()
    await chat.close()


async def _agent(rig: Rig, **settings: Any) -> None:
    await Agents(rig.database.pool).update("shop", settings=settings)


async def _trace(rig: Rig, output: CollectingTurnOutput) -> dict[str, Any]:
    assert output.done is not None
    trace = await rig.database.pool.fetchval(
        "SELECT trace FROM turns WHERE id = $1", output.done["turn_id"]
    )
    assert isinstance(trace, dict)
    return trace


def _verdicts(trace: dict[str, Any]) -> list[tuple[str, int, str]]:
    return [(g["gate"], g["attempt"], g["verdict"]) for g in trace["gates"]]


async def test_a_rejected_answer_is_written_again_and_only_the_retry_is_sent(rig: Rig) -> None:
    await _agent(rig, answer_gates=["validate"])
    draft = "Parcels take 2-3 working days [7]."
    rig.fake.replies[MODEL] = [draft, GOOD]
    output = await rig.ask(QUESTION)

    first, second = rig.fake.turn_requests
    assert first["messages"][-1] == {"role": "user", "content": QUESTION}
    assert second["messages"][-2] == {"role": "assistant", "content": draft}
    retry = second["messages"][-1]["content"]
    assert retry.startswith("Your previous answer was rejected because citation [7] refers")
    assert retry.endswith(QUESTION)
    # The visitor was sent the accepted answer, a few words at a time, and nothing else.
    assert [e.kind for e in output.events].count("token") >= 3
    assert output.streamed_text == GOOD
    assert output.done is not None
    assert (output.done["answer"], output.done["mode"]) == (GOOD, "llm")
    assert [s["id"] for s in output.sources] == [1]
    trace = await _trace(rig, output)
    assert _verdicts(trace) == [("validate", 1, "failed"), ("validate", 2, "passed")]
    assert trace["gates"][0]["reasons"] == [
        f"citation [7] refers to no source (cite only [1] to [{len(trace['sources'])}])"
    ]
    assert trace["usage"]["completion_tokens"] == len(draft.split()) + len(GOOD.split())


async def test_an_answer_rejected_twice_falls_back_and_shows_no_sources_of_its_own(
    rig: Rig,
) -> None:
    invented = "Delivery takes 2-3 days [1]. Deals at https://deals.example.net/offer."
    # Rejected twice: the quote of the sources answers instead.
    await _agent(rig, answer_gates=["validate"], answer_threshold=0.0)
    rig.fake.replies[MODEL] = [invented, invented]
    quoted = await rig.ask(QUESTION, key="quote")
    assert quoted.done is not None
    assert quoted.done["mode"] == "extractive"
    assert "2-3 working days" in quoted.streamed_text
    assert "deals.example" not in quoted.streamed_text
    assert quoted.streamed_text == quoted.done["answer"]
    assert quoted.sources  # the quote passed its own check: it shows what it cites
    trace = await _trace(rig, quoted)
    assert _verdicts(trace) == [
        ("validate", 1, "failed"), ("validate", 2, "failed"), ("fallback", 2, "extractive"),
    ]  # fmt: skip
    assert "https://deals.example.net/offer" in trace["gates"][0]["reasons"][0]

    # No quote good enough: the deferral, and no sources.
    await _agent(rig, answer_gates=["validate"], answer_threshold=1.0)
    rig.fake.replies[MODEL] = [invented, invented]
    deferred = await rig.ask("How long does a parcel to Belgium take?", key="defer")
    assert deferred.done is not None
    assert deferred.streamed_text == deferred.done["answer"] == deferral("en", "hello@shop.example")
    assert (deferred.done["mode"], deferred.done["deferred"]) == ("extractive", True)
    assert deferred.sources == []
    assert _verdicts(await _trace(rig, deferred))[-1] == ("fallback", 2, "deferral")

    # Nothing holds the answer: it streams as written, then is withdrawn for the quote,
    # which the visitor's bubble shows in its place (done.answer) with its own sources.
    await _agent(rig, answer_gates=[], answer_threshold=0.0)
    rig.fake.replies[MODEL] = [invented]
    streamed = await rig.ask("Delivery time for Belgium?", key="stream")
    assert streamed.streamed_text == invented
    assert streamed.done is not None
    assert streamed.done["mode"] == "extractive"
    assert "2-3 working days" in streamed.done["answer"]
    assert "deals.example" not in streamed.done["answer"]
    assert streamed.sources
    trace = await _trace(rig, streamed)
    assert [(g["gate"], g["verdict"]) for g in trace["gates"]] == [
        ("validate", "failed"), ("fallback", "extractive"),
    ]  # fmt: skip
    assert trace["gates"][0]["enforced"] is False
    assert trace["withdrawn"] == {"reason": "validation", "text": invented}
    stored = await rig.database.pool.fetchval("SELECT count(*) FROM turns")
    assert stored == 3
    assert len(rig.fake.turn_requests) == 5  # two drafts, two drafts, one


async def test_the_critic_sends_a_rejected_answer_back_to_the_search(rig: Rig) -> None:
    rig.fake.replies[MODEL] = ["Delivery is free [1].", GOOD]
    rig.fake.replies[CRITIC] = [
        json.dumps({"ok": False, "relevant": True, "drift": False, "supported": False,
                    "unsupported": ["delivery is free"], "search": "bpost delivery Belgium"}),
        json.dumps({"ok": True, "relevant": True, "drift": False, "supported": True}),
    ]  # fmt: skip
    output = await rig.ask(QUESTION)
    assert [r["model"] for r in rig.fake.turn_requests] == [MODEL, CRITIC, MODEL, CRITIC]
    _, review, rewrite, _ = rig.fake.turn_requests
    assert f"<question>\n{QUESTION}\n</question>" in review["messages"][1]["content"]
    assert "<answer>\nDelivery is free [1].\n</answer>" in review["messages"][1]["content"]
    assert review["temperature"] == 0
    assert "the sources do not support: delivery is free" in rewrite["messages"][-1]["content"]
    assert output.done is not None
    assert (output.done["answer"], output.done["mode"]) == (GOOD, "llm")
    assert output.streamed_text == GOOD
    assert len(output.sources) == 1
    trace = await _trace(rig, output)
    assert _verdicts(trace) == [
        ("validate", 1, "passed"), ("critic", 1, "failed"), ("retrieval", 1, "again"),
        ("validate", 2, "passed"), ("critic", 2, "passed"),
    ]  # fmt: skip
    assert trace["gates"][2]["query"] == "bpost delivery Belgium"
    assert trace["gates"][1]["model"] == CRITIC

    # The critic down: the answer is given all the same, marked not checked.
    rig.fake.models_down[CRITIC] = 404
    rig.fake.replies[MODEL] = [GOOD]
    output = await rig.ask("What does shipping to Belgium cost?", key="conv-2")
    assert output.done is not None
    assert (output.done["answer"], output.done["mode"], output.error) == (GOOD, "llm", None)
    assert len(output.sources) == 1
    trace = await _trace(rig, output)
    assert _verdicts(trace) == [("validate", 1, "passed"), ("critic", 1, "not_checked")]
    assert trace["gates"][1]["reasons"] == ["language model failed: status 404"]


async def test_sources_of_one_address_are_shown_once(
    rig: Rig, use_embedder: UseEmbedder, tmp_path: Path
) -> None:
    agents = Agents(rig.database.pool)
    agent = await agents.update("shop", allowed_origins=["https://shop.example"], settings={})
    copy = {"url": "https://shop.example/en/shipping/", "title": "Shipping", "lang": "en",
            "text": "# Shipping\nShipping to Belgium costs 4.95 euro; orders arrive in 2-3 days."}  # fmt: skip
    path = tmp_path / "copy.jsonl"
    path.write_text(json.dumps(copy), encoding="utf-8")
    await Ingestor(KnowledgeStore(rig.database.pool), use_embedder).ingest(
        agent, parse_source(str(path))
    )

    def cite_shipping(body: dict[str, Any]) -> str:
        prompt = body["messages"][0]["content"]
        numbers = [n for n, url in re.findall(r'<source id="(\d+)" url="([^"]*)"', prompt)
                   if url.rstrip("/").endswith("/en/shipping")]  # fmt: skip
        assert len(numbers) == 2, prompt
        return f"Shipping costs 4.95 euro [{numbers[0]}] and takes 2-3 days [{numbers[1]}]."

    rig.fake.responder = cite_shipping
    output = await rig.ask("What does shipping to Belgium cost and how long does it take?")
    assert output.done is not None
    assert output.done["answer"] == "Shipping costs 4.95 euro [1] and takes 2-3 days [1]."
    assert output.done["citations"] == [1]
    assert [s["title"] for s in output.sources] == ["Shipping"]


async def test_unset_gates_hold_answers_sent_whole_and_stream_those_read_as_written(
    rig: Rig, use_embedder: UseEmbedder, cache: RedisCache
) -> None:
    """No critic model and no ``answer_gates``: the JSON API (like WhatsApp and Telegram)
    gets its answer whole, so validation holds it; the widget reads it as it is written."""
    settings = rig.settings.model_copy(update={"critic_model": None})
    chat = OpenAIChatModel(MODEL, api_key="sk-test", base_url=str(settings.llm_base_url))
    async with aiohttp.ClientSession() as session:
        rig.pipeline = build_pipeline(
            settings, rig.database.pool, cache, use_embedder, session, chat
        )
        draft = "Parcels take 2-3 working days [7]."
        rig.fake.replies[MODEL] = [draft, GOOD]
        whole = await rig.ask(QUESTION, key="api")
        assert whole.streamed_text == GOOD
        assert _verdicts(await _trace(rig, whole)) == [
            ("validate", 1, "failed"), ("validate", 2, "passed"),
        ]  # fmt: skip

        rig.fake.replies[MODEL] = [draft]
        read = await rig.ask(QUESTION, key="web", channel="web")
        assert read.streamed_text == draft  # sent as written: nothing held it
        trace = await _trace(rig, read)
        assert [(g["verdict"], g["enforced"]) for g in trace["gates"]] == [("failed", False)]
        assert read.sources == []  # its sources are not shown
        await rig.pipeline.memory.drain()
    await chat.close()


async def test_the_critic_is_asked_within_the_agents_model_limits(rig: Rig) -> None:
    """With one model call at a time for the agent, a turn's critic never runs beside another
    turn's answer being written."""
    await _agent(rig, answer_gates=["validate", "critic"], llm_concurrency=1)
    rig.fake.first_token_delay = 0.2
    rig.fake.replies[MODEL] = [GOOD, GOOD]
    rig.fake.replies[CRITIC] = [json.dumps({"ok": True}), json.dumps({"ok": True})]
    first, second = await asyncio.gather(
        rig.ask(QUESTION, key="one"), rig.ask("Delivery time to Belgium?", key="two")
    )
    for output in (first, second):
        assert output.done is not None
        assert output.done["answer"] == GOOD
        assert _verdicts(await _trace(rig, output))[-1] == ("critic", 1, "passed")
    assert [body["model"] for body in rig.fake.turn_requests].count(CRITIC) == 2
    assert rig.fake.most_chats_in_flight == 1
