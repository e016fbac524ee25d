"""Tags end to end: set at ingest, by the agent's URL rules and in the console; used as filters
by the JSON API's turns and the widget's chat. On the gateway built by create_app."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from core.store import Agent, Agents
from core.store.api_keys import ApiKeys
from core.store.vector_index import EmbedderIdentity
from gateway.app import create_app
from gateway.keys import ADMIN as ADMIN_SERVICES
from gateway.keys import DATABASE, EMBEDDER
from tests.conftest import MakeSettings
from tests.support.cli import run_parley
from tests.support.console import csrf_of, sign_in
from tests.support.sse import chat

Client = TestClient[web.Request, web.Application]
TOKEN = "admin-token-for-tag-tests-0123456789"
ADMIN = "/api/v1/admin/agents/shop"

PAGES = [
    {"url": "/blog/new-bikes", "title": "New bikes", "tags": [" News "],
     "text": "# New bikes\nOur new city bikes arrived this spring, in six colours."},
    {"url": "/pricing", "title": "Prices",
     "text": "# Prices\nA city bike costs 499 euro; a repair costs 45 euro an hour."},
    {"url": "/returns", "title": "Returns",
     "text": "# Returns\nYou can return any item within 30 days. Refunds arrive within 5 working days."},
]  # fmt: skip


@dataclass
class Shop:
    client: Client
    url: str
    pool: asyncpg.Pool
    agent: Agent
    api_key: str
    tmp_path: Path
    database_url: str

    async def admin(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        response = await self.client.request(
            method, ADMIN + path, json=body, headers={"Authorization": f"Bearer {TOKEN}"}
        )
        return response.status, await response.json()

    async def turn(self, question: str, **filters: list[str]) -> tuple[int, Any]:
        body: dict[str, Any] = {"message": question}
        if filters:
            body["filters"] = filters
        response = await self.client.post(
            "/api/v1/agents/shop/turns",
            json=body,
            headers={"Authorization": f"Bearer {self.api_key}"},
        )
        return response.status, await response.json()

    async def tags(self) -> dict[str, list[str]]:
        """Each page's tags, checked to be its chunks' too."""
        rows = await self.pool.fetch(
            """SELECT p.url, p.tags, bool_and(c.tags = p.tags) AS chunks_alike
                 FROM pages p JOIN chunks c ON c.page_id = p.id GROUP BY p.url, p.tags"""
        )
        for row in rows:
            assert row["chunks_alike"], row["url"]
        return {row["url"]: row["tags"] for row in rows}

    async def version(self) -> int:
        return int(await self.pool.fetchval("SELECT knowledge_version FROM agents"))

    async def ingest(self, *args: str, rows: list[dict[str, Any]] = PAGES) -> Any:
        path = self.tmp_path / "pages.jsonl"
        path.write_text("\n".join(json.dumps(r) for r in rows) + "\n", encoding="utf-8")
        return await asyncio.to_thread(
            run_parley,
            "ingest", "--agent", "shop", *args, str(path),
            cwd=self.tmp_path, PARLEY_DATABASE_URL=self.database_url,
        )  # fmt: skip


@pytest.fixture
async def shop(
    make_settings: MakeSettings, database_url: str, tmp_path: Path
) -> AsyncIterator[Shop]:
    client: Client = TestClient(TestServer(create_app(make_settings(admin_token=TOKEN))))
    await client.start_server()
    pool = client.server.app[DATABASE].pool
    agents = Agents(pool)
    await agents.create("shop", embedder=EmbedderIdentity.of(client.server.app[EMBEDDER]))
    agent = await agents.update(
        "shop", allowed_origins=["https://shop.example"], contact_route="hello@shop.example"
    )
    key = await ApiKeys(pool).create(agent.id, "tests")
    url = str(client.server.make_url("/")).rstrip("/")
    yield Shop(client, url, pool, agent, key, tmp_path, database_url)
    await client.close()


def _urls(answered: Any) -> set[str]:
    return {source["url"] for source in answered["sources"]}


async def test_ingest_tags_and_url_rules_are_joined_and_rules_retag_at_once(shop: Shop) -> None:
    status, agent = await shop.admin(
        "PATCH", "", {"tag_rules": [{"pattern": "/blog/*", "tags": ["Blog"]}]}
    )
    assert status == 200, agent
    assert agent["tag_rules"] == [{"pattern": "/blog/*", "tags": ["blog"]}]

    ingested = await shop.ingest("--tag", "Shop ", "--tag", "lang:en")
    assert ingested.returncode == 0, ingested.stderr
    assert await shop.tags() == {
        "/blog/new-bikes": ["blog", "lang:en", "news", "shop"],  # own, rule, source
        "/pricing": ["lang:en", "shop"],
        "/returns": ["lang:en", "shop"],
    }
    assert await shop.pool.fetchval("SELECT tags FROM sources") == ["lang:en", "shop"]

    # New rules: the stored pages are retagged at once, and caches see a new version.
    before = await shop.version()
    status, agent = await shop.admin(
        "PATCH", "", {"tag_rules": [{"pattern": "/pric*", "tags": ["sales"]}]}
    )
    assert status == 200, agent
    assert agent["knowledge_version"] == await shop.version() > before
    tags = await shop.tags()
    assert tags["/blog/new-bikes"] == ["lang:en", "news", "shop"]
    assert tags["/pricing"] == ["lang:en", "sales", "shop"]
    status, answered = await shop.turn("How much does a city bike cost?", include_tags=["Sales"])
    assert status == 200, answered
    assert _urls(answered) == {"/pricing"}
    status, answered = await shop.turn("How much does a city bike cost?", include_tags=["news"])
    assert _urls(answered) <= {"/blog/new-bikes"}

    # Read again without --tag: the source keeps its tags, and they are applied again.
    again = await shop.ingest()
    assert again.returncode == 0, again.stderr
    assert (await shop.tags())["/returns"] == ["lang:en", "shop"]

    # A source added through the admin API takes tags too.
    status, added = await shop.admin(
        "POST",
        "/sources",
        {"kind": "text", "title": "Gift cards", "text": "Gift cards are sold.", "tags": ["Gifts"]},
    )
    assert (status, added["tags"]) == (202, ["gifts"])
    await shop.client.server.app[ADMIN_SERVICES].sources.wait()
    assert (await shop.tags())["/texts/gift-cards"] == ["gifts"]

    # What is not a tag is refused, naming it and where it was.
    bad = await shop.ingest("--tag", "two words")
    assert bad.returncode == 2
    assert "--tag: 'two words' is not a tag" in bad.stderr
    bad_line = await shop.ingest(rows=[PAGES[1], {**PAGES[0], "tags": ["ok", "not ok!"]}])
    assert bad_line.returncode == 2
    assert "pages.jsonl:2: tags: 'not ok!' is not a tag" in bad_line.stderr
    status, body = await shop.admin(
        "PATCH", "", {"tag_rules": [{"pattern": "blog/*", "tags": ["x"]}]}
    )
    assert status == 400
    assert "'blog/*' is not a URL path pattern" in body["error"]["message"]
    status, body = await shop.turn("How much does a bike cost?", exclude_tags=["no good!"])
    assert status == 400
    assert "filters.exclude_tags" in body["error"]["message"]
    assert "'no good!' is not a tag" in body["error"]["message"]


async def test_page_and_source_tags_edited_in_the_console_filter_every_channel(
    shop: Shop,
) -> None:
    assert (await shop.ingest()).returncode == 0
    question = "Within how many days can I return an item?"
    status, answered = await shop.turn(question)
    assert "/returns" in _urls(answered)

    # Staff tag the returns page in the console; its chunks carry the tag at once.
    console = shop.client
    assert (await sign_in(console, token=TOKEN)).status == 303
    source_id, page_id = await shop.pool.fetchrow(
        "SELECT source_id, id FROM pages WHERE url = '/returns'"
    )
    source = f"/admin/agents/shop/sources/{source_id}"
    html = await (await console.get(source)).text()
    assert 'class="tag own">news</span>' in html
    csrf = csrf_of(html)
    before = await shop.version()
    saved = await console.post(
        f"{source}/pages/{page_id}/tags",
        data={"csrf_token": csrf, "tags": "Staff-Only, returns"},
        allow_redirects=False,
    )
    assert saved.status == 303, await saved.text()
    assert saved.headers["Location"] == f"{source}?done=page-tags-saved#page-{page_id}"
    assert (await shop.tags())["/returns"] == ["returns", "staff-only"]
    assert await shop.version() > before
    refused = await console.post(
        f"{source}/pages/{page_id}/tags", data={"csrf_token": csrf, "tags": "a b"}
    )
    assert refused.status == 400
    assert "Tags: &#39;a b&#39; is not a tag" in await refused.text()

    # A source's tags go to each of its pages, next to their own.
    saved = await console.post(
        f"{source}/tags",
        data={"csrf_token": csrf, "source_tags": "bikes"},
        allow_redirects=False,
    )
    assert saved.status == 303
    tags = await shop.tags()
    assert tags["/returns"] == ["bikes", "returns", "staff-only"]
    assert tags["/pricing"] == ["bikes"]
    html = await (await console.get(source)).text()
    assert 'class="tag own">staff-only</span>' in html
    assert 'value="bikes"' in html

    # Excluded by the request's filters: never a source of the answer.
    status, answered = await shop.turn(question, exclude_tags=["staff-only"])
    assert status == 200, answered
    assert "/returns" not in _urls(answered)
    assert "30 days" not in answered["answer"]

    # Excluded by the agent's own filters: the widget's chat never cites it either.
    status, agent = await shop.admin("PATCH", "", {"exclude_tags": ["Staff-Only"]})
    assert (status, agent["exclude_tags"]) == (200, ["staff-only"])
    stream = await chat(shop.url, "shop", question, key=shop.agent.widget_key)
    assert stream.status == 200
    assert "/returns" not in {s["url"] for s in stream.data("sources")["sources"]}
    assert "30 days" not in stream.data("done")["answer"]
    # A widget's own filters (data-include-tags) narrow it further.
    stream = await chat(
        shop.url,
        "shop",
        "How much does a city bike cost?",
        key=shop.agent.widget_key,
        session_id="session-0002",
        filters={"include_tags": ["bikes"]},
    )
    assert {s["url"] for s in stream.data("sources")["sources"]} == {"/pricing"}
