"""Visitors rate their own answers from the widget; a thumbs-down shows among content gaps."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from core.knowledge.ingest import Ingestor
from core.knowledge.sources import parse_source
from core.retrieval.embedders import UseEmbedder
from core.store import Agent, Agents, Database
from core.store.knowledge import KnowledgeStore
from core.store.vector_index import EmbedderIdentity
from gateway.app import create_app
from tests.conftest import MakeSettings
from tests.support.sse import chat

TOKEN = "feedback-admin-token-0123456789abcdef"
ORIGIN = "https://shop.example"
PAGES = [
    {"url": "/en/shipping", "title": "Shipping", "lang": "en",
     "text": "# Shipping\nOrders to Belgium arrive in 2-3 working days. Shipping costs 4.95 euro."},
    {"url": "/en/returns", "title": "Returns", "lang": "en",
     "text": "# Returns\nYou can return any item within 30 days. Refunds arrive within 5 working days."},
]  # fmt: skip


@dataclass
class Shop:
    client: TestClient[web.Request, web.Application]
    http: httpx.AsyncClient
    url: str
    agent: Agent
    database: Database

    async def rate(self, body: dict[str, Any], **headers: str) -> httpx.Response:
        sent = {"X-Parley-Key": self.agent.widget_key, "Origin": ORIGIN} | headers
        return await self.http.post(
            "/api/v1/agents/shop/feedback", json=body, headers={k: v for k, v in sent.items() if v}
        )

    async def gaps(self) -> list[dict[str, Any]]:
        response = await self.client.get("/api/v1/admin/agents/shop/gaps")
        assert response.status == 200
        items: list[dict[str, Any]] = (await response.json())["items"]
        return items


@pytest.fixture
async def shop(
    make_settings: MakeSettings, database: Database, use_embedder: UseEmbedder, tmp_path: Path
) -> AsyncIterator[Shop]:
    agents = Agents(database.pool)
    await agents.create("shop", embedder=EmbedderIdentity.of(use_embedder))
    agent = await agents.update("shop", allowed_origins=[ORIGIN])
    path = tmp_path / "pages.jsonl"
    path.write_text("\n".join(json.dumps(p) for p in PAGES), encoding="utf-8")
    await Ingestor(KnowledgeStore(database.pool), use_embedder).ingest(
        agent, parse_source(str(path))
    )
    client = TestClient(
        TestServer(create_app(make_settings(admin_token=TOKEN))),
        headers={"Authorization": f"Bearer {TOKEN}"},
    )
    await client.start_server()
    url = str(client.make_url("/")).rstrip("/")
    async with httpx.AsyncClient(base_url=url) as http:
        yield Shop(client, http, url, await agents.get("shop"), database)
    await client.close()


async def _ask(shop: Shop, question: str, session: str) -> int:
    stream = await chat(shop.url, "shop", question, key=shop.agent.widget_key, session_id=session)
    turn: int = stream.data("done")["turn_id"]
    return turn


async def test_a_visitor_rates_their_own_answer_and_staff_see_the_thumbs_down(shop: Shop) -> None:
    mine = await _ask(shop, "How long does delivery to Belgium take?", "visitor-aaaa")
    theirs = await _ask(shop, "How long do refunds take?", "visitor-bbbb")
    comment = "I asked about Luxembourg too, not only Belgium"

    rated = await shop.rate(
        {"session_id": "visitor-aaaa", "turn_id": mine, "rating": "down", "comment": comment}
    )
    assert rated.status_code == 204, rated.text
    assert rated.headers["Access-Control-Allow-Origin"] == ORIGIN

    # Another session's answer, and one that does not exist, are refused alike.
    refused = [
        await shop.rate({"session_id": "visitor-aaaa", "turn_id": theirs, "rating": "down"}),
        await shop.rate({"session_id": "visitor-aaaa", "turn_id": 987654, "rating": "down"}),
        await shop.rate({"session_id": "visitor-bbbb", "turn_id": mine, "rating": "up"}),
    ]
    assert [r.status_code for r in refused] == [404, 404, 404]
    assert len({r.text for r in refused}) == 1
    assert await shop.database.pool.fetchval("SELECT count(*) FROM feedback") == 1

    [group] = [g for g in await shop.gaps() if "thumbs_down" in g["reasons"]]
    assert group["question"] == "How long does delivery to Belgium take?"
    [down] = group["feedback"]
    assert down["comment"] == comment
    assert "2-3 working days" in down["answer"]
    assert [s["url"] for s in down["sources"]] == ["/en/shipping"]

    page = await shop.client.get("/admin/agents/shop/gaps")
    html = await page.text()
    assert "Thumbs down" in html
    assert comment in html
    assert 'href="/en/shipping"' in html

    # A later rating replaces the first: thumbs up withdraws the gap.
    again = await shop.rate({"session_id": "visitor-aaaa", "turn_id": mine, "rating": "up"})
    assert again.status_code == 204
    assert await shop.database.pool.fetchval("SELECT rating FROM feedback") == "up"
    assert not [g for g in await shop.gaps() if "thumbs_down" in g["reasons"]]


async def test_feedback_is_checked_like_the_chat(shop: Shop) -> None:
    turn = await _ask(shop, "How long does delivery to Belgium take?", "visitor-cccc")
    good = {"session_id": "visitor-cccc", "turn_id": turn, "rating": "down"}

    bad_rating = await shop.rate(good | {"rating": "meh"})
    assert bad_rating.status_code == 400
    assert "rating" in bad_rating.json()["error"]["message"]
    no_turn = await shop.rate({"session_id": "visitor-cccc", "rating": "up"})
    assert no_turn.status_code == 400
    assert "turn_id" in no_turn.json()["error"]["message"]
    too_long = await shop.rate(good | {"comment": "x" * 1001})
    assert too_long.status_code == 400
    assert "comment" in too_long.json()["error"]["message"]
    broken = await shop.http.post(
        "/api/v1/agents/shop/feedback",
        content=b"{not json",
        headers={"X-Parley-Key": shop.agent.widget_key, "Content-Type": "application/json"},
    )
    assert broken.status_code == 400

    assert (await shop.rate(good, **{"X-Parley-Key": "pk_wrong"})).status_code == 401
    assert (await shop.rate(good, Origin="https://evil.example")).status_code == 403
    preflight = await shop.http.options(
        "/api/v1/agents/shop/feedback",
        headers={"Origin": ORIGIN, "Access-Control-Request-Method": "POST"},
    )
    assert preflight.status_code == 204
    assert preflight.headers["Access-Control-Allow-Origin"] == ORIGIN
    assert "X-Parley-Key" in preflight.headers["Access-Control-Allow-Headers"]
    evil = await shop.http.options(
        "/api/v1/agents/shop/feedback", headers={"Origin": "https://evil.example"}
    )
    assert evil.status_code == 403
    assert await shop.database.pool.fetchval("SELECT count(*) FROM feedback") == 0
