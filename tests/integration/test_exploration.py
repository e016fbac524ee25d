"""Exploration mode: a scripted model browses the pages with ls, find, grep and cat through the
real openai client, and the turn answers only from what it read."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestServer

from core.answer.factory import build_pipeline
from core.answer.phrases import deferral
from core.answer.pipeline import AnswerPipeline, PipelineConfig
from core.cache import RedisCache
from core.knowledge.ingest import Ingestor
from core.knowledge.sources import parse_source
from core.llm.openai_chat import OpenAIChatModel
from core.retrieval.embedders import UseEmbedder
from core.store import Agents, Database
from core.store.knowledge import KnowledgeStore
from core.store.vector_index import EmbedderIdentity
from core.turns import CollectingTurnOutput, TurnRequest
from tests.conftest import MakeSettings
from tests.fakes.openai import FakeOpenAI, calls, tool_call

MODEL = "gpt-test"
CONTACT = "hello@shop.example"
PAGES = [
    {"url": "/en/shipping/costs", "title": "Shipping costs", "lang": "en",
     "text": "# Shipping costs\nShipping to Belgium and the Netherlands costs 4.95 euro per order."},
    {"url": "/en/delivery/belgium", "title": "Delivery to Belgium", "lang": "en",
     "tags": ["delivery"],
     "text": "# Delivery to Belgium\nParcels to Belgium arrive within 2 working days."},
    {"url": "/en/about", "title": "About us", "lang": "en",
     "text": "# About us\nA family shop for hiking boots since 1998."},
    {"url": "/en/internal/margins", "title": "Belgium margins", "lang": "en",
     "visibility": "internal",
     "text": "# Belgium margins\nOur margin on orders to Belgium is 31 percent."},
    {"url": "/en/wholesale/belgium", "title": "Wholesale Belgium", "lang": "en",
     "tags": ["wholesale"],
     "text": "# Wholesale Belgium\nWholesale orders to Belgium ship on pallets."},
]  # fmt: skip


@dataclass
class Rig:
    fake: FakeOpenAI
    pipeline: AnswerPipeline
    database: Database
    agents: Agents

    async def ask(self, text: str, **fields: Any) -> CollectingTurnOutput:
        output = CollectingTurnOutput()
        key = f"c{len(self.fake.turn_requests)}"  # a conversation of its own each time
        request = TurnRequest(
            agent="shop", channel="api", conversation_key=key, text=text, **fields
        )
        await self.pipeline.run(request, output)
        return output

    async def trace(self, output: CollectingTurnOutput) -> dict[str, Any]:
        assert output.done is not None
        trace: dict[str, Any] = await self.database.pool.fetchval(
            "SELECT trace FROM turns WHERE id = $1", output.done["turn_id"]
        )
        return trace


@pytest.fixture
async def rig(
    make_settings: MakeSettings,
    database: Database,
    use_embedder: UseEmbedder,
    cache: RedisCache,
    tmp_path: Path,
) -> AsyncIterator[Rig]:
    fake = FakeOpenAI()
    server = TestServer(fake.app())
    await server.start_server()
    url = str(server.make_url("/v1"))
    agents = Agents(database.pool)
    await agents.create("shop", embedder=EmbedderIdentity.of(use_embedder))
    # No search result passes a threshold of 1: the pages are found only by exploring.
    agent = await agents.update(
        "shop", contact_route=CONTACT, confidence_threshold=1.0,
        settings={"exploration": True, "exploration_steps": 4, "exclude_tags": ["wholesale"]},
    )  # fmt: skip
    path = tmp_path / "pages.jsonl"
    path.write_text("\n".join(json.dumps(p) for p in PAGES), encoding="utf-8")
    await Ingestor(KnowledgeStore(database.pool), use_embedder).ingest(
        agent, parse_source(str(path))
    )
    settings = make_settings(llm_base_url=url, llm_api_key="sk-test", llm_model=MODEL)
    chat = OpenAIChatModel(MODEL, api_key="sk-test", base_url=url)
    async with aiohttp.ClientSession() as session:
        pipeline = build_pipeline(
            settings, database.pool, cache, use_embedder, session, chat, agents=agents,
            config=PipelineConfig(pace_seconds=0),
        )  # fmt: skip
        yield Rig(fake, pipeline, database, agents)
        await pipeline.memory.drain()
    await chat.close()
    await server.close()


def _steps(output: CollectingTurnOutput) -> list[dict[str, Any]]:
    return [dict(e.data) for e in output.events if e.kind == "status"]


async def test_a_model_explores_two_pages_and_cites_both(rig: Rig) -> None:
    rig.fake.tool_replies = [
        calls(tool_call("ls", {"path": "/en"}, "ls")),
        calls(tool_call("grep", {"pattern": "belgium"}, "grep")),
        calls(tool_call("cat", {"path": "/en/shipping/costs.md"}, "cat-1")),
        calls(tool_call("cat", {"path": "/en/delivery/belgium"}, "cat-2")),
        {"content": "Shipping costs 4.95 euro [1] and parcels to Belgium arrive within 2 "
                    "working days [2]."},
    ]  # fmt: skip
    output = await rig.ask("What does shipping to Belgium cost and how long does it take?")

    assert output.done is not None
    answer = "Shipping costs 4.95 euro [1] and parcels to Belgium arrive within 2 working days [2]."
    assert (output.done["mode"], output.done["answer"], output.done["deferred"]) == (
        "explore",
        answer,
        False,
    )
    assert output.streamed_text == answer
    assert [(s["id"], s["url"], s["title"]) for s in output.sources] == [
        (1, "/en/shipping/costs", "Shipping costs"),
        (2, "/en/delivery/belgium", "Delivery to Belgium"),
    ]
    steps = _steps(output)
    assert {"step": "reading", "page": "Shipping costs"} in steps
    assert {"step": "reading", "page": "Delivery to Belgium"} in steps
    assert steps[-1] == {"step": "answering"}

    # What the model was shown: never the internal page, nor the one the agent's tags exclude.
    results = rig.fake.tool_results
    assert results["ls"].split("\n") == [
        "delivery/", "shipping/", "about.md (About us)"
    ]  # fmt: skip
    grep = results["grep"]
    assert "/en/delivery/belgium.md:3: Parcels to Belgium arrive within 2 working days." in grep
    assert "/en/shipping/costs.md" in grep
    assert "margin" not in grep
    assert "pallets" not in grep
    assert results["cat-1"].startswith("[1] Shipping costs\nURL: /en/shipping/costs\n")
    assert "4.95 euro" in results["cat-1"]
    assert results["cat-2"].startswith("[2] Delivery to Belgium")
    requests = rig.fake.turn_requests
    assert [t["function"]["name"] for t in requests[0]["tools"]] == ["ls", "find", "grep", "cat"]
    assert "cite each one you use" in requests[0]["messages"][0]["content"]

    trace = await rig.trace(output)
    assert [(c["tool"], c["argument"]) for c in trace["exploration"]] == [
        ("ls", "/en"), ("grep", "belgium"), ("cat", "/en/shipping/costs.md"),
        ("cat", "/en/delivery/belgium.md"),
    ]  # fmt: skip
    assert [c["chars"] for c in trace["exploration"]] == [
        len(results[i]) for i in ("ls", "grep", "cat-1", "cat-2")
    ]
    assert all(c["ms"] >= 0 for c in trace["exploration"])
    assert trace["exploration_end"] == "answered"
    assert trace["usage"]["completion_tokens"] > 0


async def test_pruned_pages_do_not_exist_and_an_unread_citation_defers(rig: Rig) -> None:
    rig.fake.tool_replies = [
        calls(
            tool_call("cat", {"path": "/en/internal/margins.md"}, "internal"),
            tool_call("find", {"name": "belgium"}, "find"),
        ),
        calls(
            tool_call("cat", {"path": "/en/wholesale/belgium"}, "wholesale"),
            tool_call("grep", {"pattern": "pallets|margin|arrive"}, "grep"),
        ),
        {"content": "Parcels arrive within 2 working days [1]."},
    ]
    # The request's own tag filter prunes the delivery page too.
    output = await rig.ask("How long does delivery to Belgium take?", exclude_tags=["delivery"])

    results = rig.fake.tool_results
    assert results["internal"] == "cat: /en/internal/margins.md: no such page"
    assert results["wholesale"] == "cat: /en/wholesale/belgium: no such page"
    assert results["find"] == "find: nothing is named like 'belgium'"
    assert results["grep"] == "grep: no lines contain 'pallets|margin|arrive'"
    assert output.done is not None
    assert output.done["answer"] == deferral("en", CONTACT)
    assert output.done["deferred"] is True
    assert output.sources == []
    assert (await rig.trace(output))["exploration_end"] == "cited nothing it read"


async def test_no_evidence_no_answer_and_bounds(rig: Rig) -> None:
    # An answer from nowhere: nothing opened, nothing found by search. (The model's first
    # request with tools asks for a call outright: a server that calls tools makes one.)
    rig.fake.tool_replies = [
        calls(tool_call("find", {"name": "norway"})),
        {"content": "Delivery takes 2 days."},
    ]
    unfounded = await rig.ask("How long does delivery to Belgium take?")
    assert unfounded.done is not None
    assert unfounded.done["answer"] == deferral("en", CONTACT)
    assert unfounded.streamed_text == unfounded.done["answer"]

    # A model that never stops exploring is stopped by the step bound.
    rig.fake.tool_responder = lambda body: calls(tool_call("ls", {"path": "/"}))
    looping = await rig.ask("What does shipping cost?")
    assert looping.done is not None
    assert looping.done["answer"] == deferral("en", CONTACT)
    trace = await rig.trace(looping)
    assert [c["tool"] for c in trace["exploration"]] == ["ls"] * 4
    assert trace["exploration_end"] == "step limit"
    assert rig.fake.turn_requests[-1]["tool_choice"] == "none"  # the last ask allowed no tools

    # What search found counts as evidence: cited without being opened, it answers.
    await rig.agents.update("shop", confidence_threshold=0.0)
    rig.fake.tool_responder = None
    rig.fake.tool_replies = [{"content": "Shipping costs 4.95 euro [1]."}]
    found = await rig.ask("What does shipping to Belgium cost?")
    assert found.done is not None
    assert (found.done["answer"], found.done["mode"]) == (
        "Shipping costs 4.95 euro [1].",
        "explore",
    )
    first = (await rig.trace(found))["sources"][0]
    assert [s["url"] for s in found.sources] == [first["url"]]

    # A model that fails while exploring fails the turn as a single answer would.
    await rig.pipeline.memory.drain()  # no topic written in the background takes the failure
    rig.fake.chat_down_with = 500
    failed = await rig.ask("Do you ship to Norway?")  # (not one the answer cache knows)
    assert failed.error == {"code": "llm_failed", "message": "the answer could not be generated"}


ANSWER = "Shipping to Belgium costs 4.95 euro per order [1]."


def _with_tools(rig: Rig) -> list[dict[str, Any]]:
    return [body for body in rig.fake.turn_requests if body.get("tools")]


async def test_a_server_without_tools_gets_the_answer_written_from_the_search(rig: Rig) -> None:
    # llama.cpp serving a model whose chat template has no tools: they are dropped without a
    # word and the model answers in text, even when asked for a tool call.
    rig.fake.server, rig.fake.tools_supported = "llama.cpp", False
    rig.fake.responder = lambda body: ANSWER
    await rig.agents.update("shop", confidence_threshold=0.0)
    output = await rig.ask("What does shipping to Belgium cost?")

    assert output.error is None
    assert output.done is not None
    assert (output.done["answer"], output.done["mode"]) == (ANSWER, "llm")
    assert output.streamed_text == ANSWER
    assert _steps(output)[-1] == {"step": "answering"}
    trace = await rig.trace(output)
    assert trace["exploration_fell_back"] == "tools unsupported by the server"
    assert [s["url"] for s in output.sources] == [trace["sources"][0]["url"]]
    # The one request with tools asked for a call, one at a time; the answer streamed, and
    # llama.cpp's last chunk (no choices, the usage) was read.
    (probe,) = _with_tools(rig)
    assert (probe["tool_choice"], probe["parallel_tool_calls"]) == ("required", False)
    streamed = rig.fake.turn_requests[-1]
    assert streamed["stream"] is True
    assert "tools" not in streamed
    assert trace["usage"]["completion_tokens"] == len(ANSWER.split())

    # Remembered: the next turn asks for no tools at all.
    again = await rig.ask("How long does delivery to Belgium take?")
    assert again.done is not None
    assert (again.done["answer"], again.done["mode"]) == (ANSWER, "llm")
    assert (await rig.trace(again))["exploration_fell_back"] == "tools unsupported by the server"
    assert len(_with_tools(rig)) == 1


async def test_a_tool_call_cut_by_max_tokens_gets_the_answer_written_from_the_search(
    rig: Rig,
) -> None:
    # llama.cpp, tools and all: a call whose arguments max_tokens (700) cuts in half does not
    # parse, and llama.cpp answers 500.
    rig.fake.server = "llama.cpp"
    rig.fake.tool_responder = lambda body: calls(tool_call("grep", {"pattern": "belgium " * 900}))
    rig.fake.responder = lambda body: ANSWER
    await rig.agents.update("shop", confidence_threshold=0.0)
    output = await rig.ask("What does shipping to Belgium cost?")

    assert output.error is None
    assert output.done is not None
    assert (output.done["answer"], output.done["mode"]) == (ANSWER, "llm")
    assert output.streamed_text == ANSWER
    assert len(output.sources) == 1
    trace = await rig.trace(output)
    assert trace["exploration_fell_back"] == (
        "a request with tools failed (language model failed: status 500)"
    )
    assert trace["exploration"] == []


async def test_one_tool_call_at_a_time_is_asked_for_where_the_server_takes_the_field(
    rig: Rig,
) -> None:
    rig.fake.tool_replies = [
        calls(tool_call("cat", {"path": "/en/shipping/costs.md"}, "cat")),
        {"content": "Shipping costs 4.95 euro [1]."},
    ]
    first = await rig.ask("What does shipping to Belgium cost?")
    assert first.done is not None
    assert first.done["mode"] == "explore"
    assert [body["parallel_tool_calls"] for body in _with_tools(rig)] == [False, False]

    # A strict server refuses the field by name: asked once more without it, and never again.
    rig.fake.server = "strict"
    rig.fake.tool_replies = [
        calls(tool_call("cat", {"path": "/en/shipping/costs.md"}, "cat-2")),
        {"content": "Shipping costs 4.95 euro [1]."},
    ]
    second = await rig.ask("And what does shipping to Belgium cost now?")
    assert second.done is not None
    assert (second.done["answer"], second.done["mode"]) == (
        "Shipping costs 4.95 euro [1].",
        "explore",
    )
    asked = _with_tools(rig)[2:]
    assert ["parallel_tool_calls" in body for body in asked] == [True, False, False]
