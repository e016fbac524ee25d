"""Inbox work through the admin API and the console: what the list tells, search, status,
assignment, labels, internal notes, saved replies and the live list's change feed."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import asyncpg
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from channels.registry import secret_fields
from core.cache import LocalCache
from core.keyring import Keyring
from core.memory import ConversationMemory, Summarizer
from core.retrieval.embedders import UseEmbedder
from core.settings import Settings
from core.store import Agents, Database
from core.store.memory import MemoryStore
from core.store.staff import StaffAccounts
from core.store.vector_index import EmbedderIdentity
from gateway.app import create_app
from tests.conftest import MakeSettings
from tests.support.console import csrf_of, sign_in

Client = TestClient[web.Request, web.Application]
API = "/api/v1/admin"
PASSWORD = "correct horse battery staple"
LONG = "My order " + "really " * 60 + "never arrived."


@dataclass
class Desk:
    client: Client
    pool: asyncpg.Pool
    ids: dict[str, int]  # customer -> conversation id
    ada: int  # the signed-in staff account
    sam: int

    async def api(self, method: str, path: str, status: int = 200, **kw: Any) -> Any:
        html = await (await self.client.get("/admin/conversations")).text()
        headers = {"X-CSRF-Token": csrf_of(html)}
        response = await self.client.request(method, API + path, headers=headers, **kw)
        assert response.status == status, await response.text()
        return await response.json() if response.status != 204 else None

    async def listed(self, query: str = "") -> dict[int, dict[str, Any]]:
        page = await self.api("GET", "/conversations" + query)
        return {item["id"]: item for item in page["items"]}


async def _conversation(
    pool: asyncpg.Pool, agent_id: int, channel: str, key: str, name: str | None,
    messages: list[tuple[str, str]],
) -> int:  # fmt: skip
    conversation_id: int = await pool.fetchval(
        """INSERT INTO conversations (agent_id, channel, conversation_key, customer_name)
           VALUES ($1, $2, $3, $4) RETURNING id""",
        agent_id, channel, key, name,
    )  # fmt: skip
    for role, text in messages:
        await pool.execute(
            "INSERT INTO messages (conversation_id, role, text) VALUES ($1, $2, $3)",
            conversation_id, role, text,
        )  # fmt: skip
    return conversation_id


@pytest.fixture
async def desk(
    make_settings: MakeSettings, settings: Settings, database: Database,
    use_embedder: UseEmbedder,
) -> AsyncIterator[Desk]:  # fmt: skip
    pool = database.pool
    agents = Agents(pool, keyring=Keyring.from_settings(settings), secret_fields=secret_fields())
    agent = await agents.create(
        "shop", embedder=EmbedderIdentity.of(use_embedder), name="Noordkaap Shop"
    )
    staff = StaffAccounts(pool)
    ada = await staff.create("ada@shop.example", PASSWORD, display_name="Ada", role="admin")
    sam = await staff.create("sam@shop.example", PASSWORD, display_name="Sam")
    ids = {
        "marieke": await _conversation(pool, agent.id, "web", "session-marieke-1", "Marieke de Vries", [
            ("visitor", "Where is my parcel to Utrecht?"),
            ("assistant", "It ships tomorrow from our warehouse."),
        ]),
        "pieter": await _conversation(pool, agent.id, "telegram", "4242", "Pieter", [
            ("visitor", "Kan ik mijn jas retourneren?"),
        ]),
        "long": await _conversation(pool, agent.id, "web", "session-long-22", None, [
            ("visitor", LONG),
        ]),
    }  # fmt: skip
    client: Client = TestClient(TestServer(create_app(make_settings())))
    await client.start_server()
    response = await sign_in(client, email="ada@shop.example", password=PASSWORD)
    assert response.status == 303
    yield Desk(client, pool, ids, ada.id, sam.id)
    await client.close()


async def test_the_list_tells_what_each_conversation_is_about(desk: Desk) -> None:
    rows = await desk.listed()
    marieke, pieter, long = (rows[desk.ids[k]] for k in ("marieke", "pieter", "long"))
    assert marieke["customer"] == "Marieke de Vries"
    assert marieke["last_text"] == "It ships tomorrow from our warehouse."
    # No summary yet: the first question stands in for it.
    assert marieke["summary_line"] is None
    assert marieke["first_question"] == "Where is my parcel to Utrecht?"
    assert long["last_text"].endswith("…")
    assert len(long["last_text"]) == 120
    assert all(r["unread"] for r in (marieke, pieter, long))
    assert marieke["inbox_status"] == "open"
    assert marieke["assignee"] is None

    html = await (await desk.client.get("/admin/conversations")).text()
    assert "Where is my parcel to Utrecht?" in html
    assert "It ships tomorrow from our warehouse." in html
    assert html.count('class="unread-dot"') == 3

    # Opening a conversation reads it, for every staff member; the visitor writing unreads it.
    assert (await desk.client.get(f"/admin/conversations/{desk.ids['marieke']}")).status == 200
    assert not (await desk.listed())[desk.ids["marieke"]]["unread"]
    await desk.pool.execute(
        "INSERT INTO messages (conversation_id, role, text) VALUES ($1, 'visitor', 'Hello?')",
        desk.ids["marieke"],
    )
    assert (await desk.listed())[desk.ids["marieke"]]["unread"]

    # Search: by what was said (any language, whole words) and by the customer's name.
    assert set(await desk.listed("?search=retourneren")) == {desk.ids["pieter"]}
    assert set(await desk.listed("?search=utrecht")) == {desk.ids["marieke"]}
    assert set(await desk.listed("?search=Marieke")) == {desk.ids["marieke"]}
    html = await (await desk.client.get("/admin/conversations?q=jas")).text()
    assert "Pieter" in html
    assert "Marieke" not in html


async def test_status_assignment_and_labels(desk: Desk) -> None:
    marieke, pieter = desk.ids["marieke"], desk.ids["pieter"]
    await desk.api("POST", f"/conversations/{marieke}/takeover")
    pending = await desk.api("POST", f"/conversations/{marieke}/status", json={"status": "pending"})
    assert pending["inbox_status"] == "pending"
    assert pending["status"] == "staff"
    resolved = await desk.api(
        "POST", f"/conversations/{marieke}/status", json={"status": "resolved"}
    )
    assert resolved["inbox_status"] == "resolved"
    assert resolved["status"] == "bot"  # handed back: the bot answers again
    assert set(await desk.listed("?inbox_status=resolved")) == {marieke}
    await desk.pool.execute(
        "INSERT INTO messages (conversation_id, role, text) VALUES ($1, 'visitor', 'One more')",
        marieke,
    )
    assert (await desk.listed())[marieke]["inbox_status"] == "open"  # writing again reopens

    # Assignment: mine and unassigned views, in the API and the console.
    await desk.api("POST", f"/conversations/{marieke}/assign", json={"staff_id": desk.ada})
    await desk.api("POST", f"/conversations/{pieter}/assign", json={"staff_id": desk.sam})
    assert set(await desk.listed("?view=mine")) == {marieke}
    assert set(await desk.listed("?view=unassigned")) == {desk.ids["long"]}
    mine = await (await desk.client.get("/admin/conversations?view=mine")).text()
    assert "Marieke" in mine
    assert "Pieter" not in mine
    assert "Ada" in mine
    teammates = await desk.api("GET", "/teammates")
    assert {t["name"] for t in teammates["items"]} == {"Ada", "Sam"}

    # Labels: free text, filter by one, take one off.
    await desk.api("POST", f"/conversations/{pieter}/labels", json={"label": "returns"})
    await desk.api("POST", f"/conversations/{marieke}/labels", json={"label": "vip"})
    assert set(await desk.listed("?label=returns")) == {pieter}
    assert (await desk.api("GET", "/labels"))["items"] == ["returns", "vip"]
    off = await desk.api("DELETE", f"/conversations/{pieter}/labels", params={"label": "returns"})
    assert off["labels"] == []
    assert set(await desk.listed("?label=returns")) == set()

    # The console's forms do the same.
    html = await (await desk.client.get(f"/admin/conversations/{pieter}")).text()
    response = await desk.client.post(
        f"/admin/conversations/{pieter}/status",
        data={"csrf_token": csrf_of(html), "status": "resolved"},
        allow_redirects=False,
    )
    assert response.status == 303
    assert (await desk.listed())[pieter]["inbox_status"] == "resolved"


async def test_notes_stay_with_staff_and_saved_replies_fill_in(desk: Desk) -> None:
    marieke = desk.ids["marieke"]
    secret = "Customer was rude on the phone, refund approved by Joost"
    note = await desk.api(
        "POST", f"/conversations/{marieke}/notes", json={"text": secret}, status=201
    )
    assert note["author"] == "ada@shop.example"
    await desk.api(
        "POST", f"/conversations/{marieke}/messages", json={"text": "On its way!"}, status=201
    )
    html = await (await desk.client.get(f"/admin/conversations/{marieke}")).text()
    assert secret in html
    assert "only staff see these" in html

    # Neither the bot's memory (what the prompt is built from) nor the outbox holds the note.
    memory = ConversationMemory(MemoryStore(desk.pool), LocalCache(), Summarizer(None))
    recalled = await memory.recall(marieke)
    assert "On its way!" in repr(recalled)  # the memory does see what was said
    assert secret not in repr(recalled)
    outgoing = await desk.pool.fetch("SELECT * FROM outbox")
    assert secret not in repr([dict(r) for r in outgoing])
    assert await desk.pool.fetchval(
        "SELECT count(*) FROM messages WHERE text = $1", secret
    ) == 0  # fmt: skip

    # Saved replies: per agent, placeholders filled in for the conversation and the staff.
    await desk.api(
        "POST", "/agents/shop/saved-replies", status=201,
        json={"title": "Thanks", "text": "Hi {{customer_name}}, {{agent_name}} here. Thanks!"},
    )  # fmt: skip
    filled = await desk.api("GET", f"/conversations/{marieke}/saved-replies")
    assert filled["items"][0]["text"] == "Hi Marieke de Vries, Ada here. Thanks!"
    html = await (await desk.client.get(f"/admin/conversations/{marieke}")).text()
    assert "Hi Marieke de Vries, Ada here. Thanks!" in html


async def test_the_change_feed_answers_when_a_message_arrives(desk: Desk) -> None:
    first = await desk.api("GET", "/conversations/changes", params={"wait": "0"})
    waiting = asyncio.create_task(
        desk.api("GET", "/conversations/changes", params={"since": first["version"], "wait": "20"})
    )
    await asyncio.sleep(0.3)
    assert not waiting.done()  # nothing changed: it waits
    started = asyncio.get_running_loop().time()
    await desk.pool.execute(
        "INSERT INTO messages (conversation_id, role, text) VALUES ($1, 'visitor', 'Hi again')",
        desk.ids["pieter"],
    )
    answer = await asyncio.wait_for(waiting, 10)
    assert answer["changed"]
    assert answer["version"] != first["version"]
    assert asyncio.get_running_loop().time() - started < 3  # woken by the feed, not a timer


async def test_resolving_records_who_and_when_once_per_resolving(desk: Desk) -> None:
    marieke = desk.ids["marieke"]
    started = await desk.pool.fetchval("SELECT now()")

    async def resolutions() -> list[tuple[str, bool]]:
        rows = await desk.pool.fetch(
            """SELECT staff, resolved_at BETWEEN $2 AND now() AS just_now
                 FROM conversation_resolutions WHERE conversation_id = $1 ORDER BY id""",
            marieke,
            started,
        )
        return [(r["staff"], r["just_now"]) for r in rows]

    await desk.api("POST", f"/conversations/{marieke}/status", json={"status": "pending"})
    assert await resolutions() == []
    for _ in range(2):  # resolving what is resolved already is no second resolving
        done = await desk.api(
            "POST", f"/conversations/{marieke}/status", json={"status": "resolved"}
        )
        assert done["inbox_status"] == "resolved"
    assert await resolutions() == [("ada@shop.example", True)]

    # The customer writes again (reopened), and it is resolved again: a second resolving.
    await desk.pool.execute(
        "INSERT INTO messages (conversation_id, role, text) VALUES ($1, 'visitor', 'Thanks!')",
        marieke,
    )
    await desk.api("POST", f"/conversations/{marieke}/status", json={"status": "resolved"})
    assert await resolutions() == [("ada@shop.example", True)] * 2


async def test_labels_are_listed_per_agent(desk: Desk, use_embedder: UseEmbedder) -> None:
    help_desk = await Agents(desk.pool).create("help", embedder=EmbedderIdentity.of(use_embedder))
    other = await _conversation(desk.pool, help_desk.id, "web", "session-help-1", None, [
        ("visitor", "Is my warranty still valid?"),
    ])  # fmt: skip
    await desk.api("POST", f"/conversations/{desk.ids['pieter']}/labels", json={"label": "returns"})
    await desk.api("POST", f"/conversations/{other}/labels", json={"label": "warranty"})

    assert (await desk.api("GET", "/labels"))["items"] == ["returns", "warranty"]
    assert (await desk.api("GET", "/labels", params={"agent": "shop"}))["items"] == ["returns"]
    assert (await desk.api("GET", "/labels", params={"agent": "help"}))["items"] == ["warranty"]
    await desk.api("GET", "/labels", params={"agent": "nobody"}, status=404)

    # A conversation's page suggests the labels of its own agent only.
    html = await (await desk.client.get(f"/admin/conversations/{desk.ids['marieke']}")).text()
    assert '<datalist id="known-labels"><option value="returns"></datalist>' in html
    html = await (await desk.client.get(f"/admin/conversations/{other}")).text()
    assert '<datalist id="known-labels"><option value="warranty"></datalist>' in html
