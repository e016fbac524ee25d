"""The widget's chat endpoint and the JSON API, answered by the pipeline without an LLM."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from aiohttp.test_utils import TestServer
from httpx_sse import aconnect_sse

from core.knowledge.ingest import Ingestor
from core.knowledge.sources import parse_source
from core.retrieval.embedders import UseEmbedder
from core.settings import Settings
from core.store import Agent, Agents, Database
from core.store.api_keys import ApiKeys
from core.store.knowledge import KnowledgeStore
from core.store.vector_index import EmbedderIdentity
from gateway.app import create_app
from tests.conftest import MakeSettings
from tests.fakes.rerank import FakeReranker
from tests.support.sse import chat

PAGES = [
    {"url": "/en/faq", "title": "FAQ", "lang": "en",
     "text": "# FAQ\n## Delivery to Belgium\nHow long does delivery to Belgium take? Parcels to Belgium are delivered within 2-3 working days by bpost."},
    {"url": "/en/shipping", "title": "Shipping", "lang": "en",
     "text": "# Shipping\nOrders to Belgium arrive in 2-3 working days. Shipping costs 4.95 euro."},
    {"url": "/en/returns", "title": "Returns", "lang": "en",
     "text": "# Returns\nYou can return any item within 30 days. Refunds arrive within 5 working days."},
]  # fmt: skip


@dataclass
class Shop:
    url: str
    agent: Agent
    database: Database


async def _prepare(database: Database, embedder: UseEmbedder, tmp_path: Path) -> Agent:
    agents = Agents(database.pool)
    await agents.create("shop", embedder=EmbedderIdentity.of(embedder))
    agent = await agents.update(
        "shop", allowed_origins=["https://shop.example"], contact_route="hello@shop.example"
    )
    path = tmp_path / "pages.jsonl"
    path.write_text("\n".join(json.dumps(p) for p in PAGES), encoding="utf-8")
    await Ingestor(KnowledgeStore(database.pool), embedder).ingest(agent, parse_source(str(path)))
    return await agents.get("shop")


@pytest.fixture
async def shop(
    settings: Settings, database: Database, use_embedder: UseEmbedder, tmp_path: Path
) -> AsyncIterator[Shop]:
    agent = await _prepare(database, use_embedder, tmp_path)
    server = TestServer(create_app(settings))
    await server.start_server()
    yield Shop(str(server.make_url("/")).rstrip("/"), agent, database)
    await server.close()


async def test_a_turn_streams_events_in_order_and_is_saved(shop: Shop) -> None:
    stream = await chat(
        shop.url, "shop", "How long does delivery to Belgium take?", key=shop.agent.widget_key
    )
    assert stream.status == 200
    assert stream.headers["content-type"].startswith("text/event-stream")
    kinds = stream.kinds()
    assert kinds[:3] == ["status", "status", "status"]
    assert [stream.events[i][1]["step"] for i in range(3)] == ["searching", "reading", "answering"]
    assert kinds[3:-3] == ["token"] * (len(kinds) - 6)
    assert len(kinds) - 6 >= 2  # streamed in pieces
    # The other page about Belgium, which the answer did not cite, is offered to read on.
    assert kinds[-3:] == ["sources", "related", "done"]
    done = stream.data("done")
    assert done["mode"] == "extractive"
    assert "2-3 working days" in done["answer"]
    assert "[1]" in done["answer"]
    assert done["citations"]
    assert not done["low_confidence"]
    shown = stream.data("sources")["sources"]
    assert [s["id"] for s in shown] == done["citations"]  # the sources the answer cites
    assert shown[0]["url"] in ("/en/faq", "/en/shipping")
    related = stream.data("related")["related"]
    assert {p["url"] for p in related} & {"/en/faq", "/en/shipping"} - {shown[0]["url"]}

    rows = await shop.database.pool.fetch(
        "SELECT role, text FROM messages WHERE conversation_id = $1 ORDER BY id",
        done["conversation_id"],
    )
    assert [(r["role"], r["text"]) for r in rows] == [
        ("visitor", "How long does delivery to Belgium take?"),
        ("assistant", done["answer"]),
    ]
    trace = await shop.database.pool.fetchval(
        "SELECT trace FROM turns WHERE id = $1", done["turn_id"]
    )
    assert trace["retrieved"][0]["url"] in ("/en/faq", "/en/shipping")
    assert trace["query"] == "How long does delivery to Belgium take?"
    assert {"rewrite", "retrieve", "generate", "total"} <= set(trace["timings_ms"])
    assert await shop.database.pool.fetchval("SELECT turns FROM usage WHERE channel = 'web'") == 1


async def test_the_visitor_sees_the_search_begin_before_it_ends(
    make_settings: MakeSettings, database: Database, use_embedder: UseEmbedder, tmp_path: Path
) -> None:
    """The first event says "searching" while the search is still running: here its reranker
    holds every request until the visitor has that event, so the turn could not go on
    without it."""
    release = asyncio.Event()
    reranker = FakeReranker("Belgium", hold=release)
    ranking = TestServer(reranker.app())
    await ranking.start_server()
    agent = await _prepare(database, use_embedder, tmp_path)
    settings = make_settings(rerank_url=str(ranking.make_url("/rerank")))
    server = TestServer(create_app(settings))
    await server.start_server()
    body = {"message": "How long does delivery to Belgium take?", "session_id": "session-0001"}
    try:
        async with (
            httpx.AsyncClient(base_url=str(server.make_url("/")), timeout=60) as client,
            aconnect_sse(client, "POST", "/api/v1/agents/shop/chat", json=body,
                         headers={"X-Parley-Key": agent.widget_key}) as source,
        ):  # fmt: skip
            events = source.aiter_sse()
            first = await anext(events)
            assert (first.event, json.loads(first.data)) == ("status", {"step": "searching"})
            release.set()
            rest = [(e.event, json.loads(e.data)) async for e in events]
    finally:
        await server.close()
        await ranking.close()
    # The search had the reranker to wait for.
    assert reranker.requests[0]["query"] == "How long does delivery to Belgium take?"
    assert [d["step"] for k, d in rest if k == "status"] == ["reading", "answering"]
    assert rest[-1][0] == "done"
    assert "2-3 working days" in rest[-1][1]["answer"]


async def test_an_unanswerable_question_is_a_content_gap(shop: Shop) -> None:
    stream = await chat(shop.url, "shop", "Do you repair bicycles?", key=shop.agent.widget_key)
    done = stream.data("done")
    assert done["low_confidence"]
    assert "hello@shop.example" in done["answer"]
    assert stream.data("sources")["sources"] == []
    gap = await shop.database.pool.fetchrow("SELECT question, reason FROM content_gaps")
    assert (gap["question"], gap["reason"]) == ("Do you repair bicycles?", "weak_match")


async def test_widget_key_and_agent_are_checked_first(shop: Shop) -> None:
    missing = await chat(shop.url, "shop", "hi there", key="")
    assert missing.status == 401
    assert missing.data("http_error")["error"]["code"] == "unauthorized"
    wrong = await chat(shop.url, "shop", "hi there", key="pk_wrong")
    assert wrong.status == 401
    unknown = await chat(shop.url, "nope", "hi there", key=shop.agent.widget_key)
    assert unknown.status == 404
    assert await shop.database.pool.fetchval("SELECT count(*) FROM messages") == 0


async def test_origins_and_cors_preflight(shop: Shop) -> None:
    key = shop.agent.widget_key
    foreign = await chat(
        shop.url, "shop", "Shipping to Belgium?", key=key, origin="https://evil.example"
    )
    assert foreign.status == 403
    allowed = await chat(
        shop.url, "shop", "Shipping to Belgium?", key=key, origin="https://shop.example"
    )
    assert allowed.status == 200
    assert allowed.headers["access-control-allow-origin"] == "https://shop.example"
    own = await chat(
        shop.url,
        "shop",
        "Shipping to Belgium?",
        key=key,
        origin=shop.url,
        session_id="session-0002",
    )
    assert own.status == 200
    rejected = await chat(
        shop.url, "shop", "Shipping?", key="pk_wrong", origin="https://shop.example"
    )
    assert rejected.status == 401
    # The browser may read why: an allowed origin gets CORS headers on errors too.
    assert rejected.headers["access-control-allow-origin"] == "https://shop.example"
    async with httpx.AsyncClient(base_url=shop.url) as client:
        ok = await client.options(
            "/api/v1/agents/shop/chat",
            headers={"Origin": "https://shop.example", "Access-Control-Request-Method": "POST"},
        )
        assert ok.status_code == 204
        assert "X-Parley-Key" in ok.headers["access-control-allow-headers"]
        refused = await client.options(
            "/api/v1/agents/shop/chat", headers={"Origin": "https://evil.example"}
        )
        assert refused.status_code == 403


@pytest.mark.parametrize(
    ("body", "complaint"),
    [
        ({"message": "", "session_id": "session-0001"}, "message"),
        ({"message": "x" * 4001, "session_id": "session-0001"}, "message"),
        ({"message": "hi", "session_id": "bad id!"}, "session_id"),
        ({"session_id": "session-0001"}, "message"),
    ],
)
async def test_bad_bodies_are_400_and_store_nothing(
    shop: Shop, body: dict[str, str], complaint: str
) -> None:
    async with httpx.AsyncClient(base_url=shop.url) as client:
        response = await client.post(
            "/api/v1/agents/shop/chat", json=body, headers={"X-Parley-Key": shop.agent.widget_key}
        )
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == "invalid_input"
    assert error["message"].startswith(complaint)
    assert await shop.database.pool.fetchval("SELECT count(*) FROM messages") == 0


async def test_a_session_over_its_budget_gets_429_and_an_error_event(shop: Shop) -> None:
    statuses = []
    for _ in range(6):
        stream = await chat(
            shop.url,
            "shop",
            "Shipping to Belgium?",
            key=shop.agent.widget_key,
            session_id="session-burst",
        )
        statuses.append(stream.status)
    assert statuses == [200] * 5 + [429]
    assert stream.kinds() == ["error"]
    assert stream.data("error")["code"] == "rate_limited"
    assert int(stream.headers["retry-after"]) >= 1
    other = await chat(
        shop.url,
        "shop",
        "Shipping to Belgium?",
        key=shop.agent.widget_key,
        session_id="session-calm",
    )
    assert other.status == 200  # another visitor is not affected


async def test_json_api_with_an_api_key(shop: Shop) -> None:
    key = await ApiKeys(shop.database.pool).create(shop.agent.id, "crm")
    stored = await shop.database.pool.fetchval("SELECT key_hash FROM api_keys")
    assert key.encode() not in stored  # only the hash is kept
    async with httpx.AsyncClient(base_url=shop.url, timeout=60) as client:
        answered = await client.post(
            "/api/v1/agents/shop/turns",
            json={
                "message": "Within how many days can I return something?",
                "session_id": "crm-42",
            },
            headers={"Authorization": f"Bearer {key}"},
        )
        assert answered.status_code == 200
        body = answered.json()
        assert "30 days" in body["answer"]
        assert body["sources"][0]["url"] == "/en/returns"
        assert set(body) >= {
            "answer",
            "sources",
            "confidence",
            "low_confidence",
            "conversation_id",
            "turn_id",
        }
        assert body["session_id"] == "crm-42"
        no_key = await client.post("/api/v1/agents/shop/turns", json={"message": "hi"})
        assert no_key.status_code == 401
        bad_key = await client.post(
            "/api/v1/agents/shop/turns",
            json={"message": "hi"},
            headers={"Authorization": "Bearer sk_nope"},
        )
        assert bad_key.status_code == 401


async def test_a_nul_in_the_message_is_dropped_and_the_turn_answered(shop: Shop) -> None:
    stream = await chat(
        shop.url,
        "shop",
        "How long does delivery\u0000 to Belgium\u0007 take?",
        key=shop.agent.widget_key,
    )
    assert stream.status == 200
    assert stream.kinds()[-3:] == ["sources", "related", "done"]
    done = stream.data("done")
    assert "2-3 working days" in done["answer"]
    visitor = await shop.database.pool.fetchval(
        "SELECT text FROM messages WHERE conversation_id = $1 AND role = 'visitor'",
        done["conversation_id"],
    )
    assert visitor == "How long does delivery to Belgium take?"


async def test_json_api_answers_a_message_with_a_nul(shop: Shop) -> None:
    key = await ApiKeys(shop.database.pool).create(shop.agent.id, "crm")
    async with httpx.AsyncClient(base_url=shop.url, timeout=60) as client:
        answered = await client.post(
            "/api/v1/agents/shop/turns",
            json={"message": "Within how many days can I return\u0000 something?"},
            headers={"Authorization": f"Bearer {key}"},
        )
        assert answered.status_code == 200, answered.text
        assert "30 days" in answered.json()["answer"]
        only_nul = await client.post(
            "/api/v1/agents/shop/turns",
            json={"message": "\u0000"},
            headers={"Authorization": f"Bearer {key}"},
        )
        assert only_nul.status_code == 400
        assert only_nul.json()["error"]["message"].startswith("message")
