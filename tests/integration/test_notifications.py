"""Being told: a customer who asks for a person, or waits too long, reaches staff's webhook
(signed, retried, recorded) and the console's live count."""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import httpx
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from httpx_sse import aconnect_sse

from core.jobs.notifier import Notifier, Webhook
from core.store import Database
from core.store.handoff import HandoffStore
from core.store.notifications import Notifications
from gateway.app import create_app
from tests.conftest import MakeSettings

SECRET = "notify-secret-for-the-tests-0123456789abcdef"
TOKEN = "admin-token-for-notify-tests-0123456789"
PHONE = "whatsapp:+31612345678"


@dataclass
class Receiver:
    """Staff's own system: checks the signature as the README tells them, fails at first."""

    fail_first: int = 1
    bodies: list[dict[str, Any]] = field(default_factory=list)
    raw: list[bytes] = field(default_factory=list)

    async def handle(self, request: web.Request) -> web.Response:
        body = await request.read()
        t, v1 = (p.split("=", 1)[1] for p in request.headers["X-Parley-Signature"].split(","))
        expected = hmac.new(SECRET.encode(), f"{t}.".encode() + body, hashlib.sha256).hexdigest()
        if not hmac.compare_digest(expected, v1):
            return web.Response(status=401)
        self.raw.append(body)
        self.bodies.append(json.loads(body))
        if len(self.bodies) <= self.fail_first:
            return web.Response(status=500)
        return web.Response(status=204)


@pytest.fixture
async def receiver() -> AsyncIterator[tuple[Receiver, str]]:
    fake = Receiver()
    app = web.Application()
    app.router.add_post("/hook", fake.handle)
    server = TestServer(app)
    await server.start_server()
    yield fake, str(server.make_url("/hook"))
    await server.close()


async def _conversation(database: Database, channel: str, key: str, **columns: Any) -> int:
    pool = database.pool
    agent_id = await pool.fetchval("SELECT id FROM agents WHERE slug = 'shop'")
    if agent_id is None:
        agent_id = await pool.fetchval(
            "INSERT INTO agents (slug, name, widget_key) VALUES ('shop', 'Shop', 'wk') RETURNING id"
        )
    conversation: int = await pool.fetchval(
        """INSERT INTO conversations (agent_id, channel, conversation_key, customer_name,
                                      customer_handle)
           VALUES ($1, $2, $3, $4, $5) RETURNING id""",
        agent_id,
        channel,
        key,
        columns.get("name"),
        columns.get("handle"),
    )
    return conversation


async def _message(database: Database, conversation: int, role: str, minutes_ago: float) -> None:
    await database.pool.execute(
        """INSERT INTO messages (conversation_id, role, text, created_at)
           VALUES ($1, $2, 'hello', now() - make_interval(secs => $3))""",
        conversation,
        role,
        minutes_ago * 60,
    )


def _notifier(database: Database, url: str | None) -> Notifier:
    return Notifier(
        Notifications(database.pool),
        webhook=Webhook(url, SECRET) if url else None,
        waiting_after=600,
        console_url="https://support.example",
        backoff_base=0.01,
    )


async def test_asking_for_a_person_is_posted_signed_retried_and_recorded(
    database: Database, receiver: tuple[Receiver, str]
) -> None:
    fake, url = receiver
    conversation = await _conversation(database, "whatsapp", PHONE, name="Ann")
    await HandoffStore(database.pool).change_status(conversation, "waiting_for_staff", author=None)
    notifier = _notifier(database, url)
    async with aiohttp.ClientSession() as http:
        assert await notifier.once(http) == 1  # the receiver answers 500
        await database.pool.execute("UPDATE notifications SET next_attempt_at = now()")
        assert await notifier.once(http) == 1  # accepted
        assert await notifier.once(http) == 0  # nothing left to send

    assert len(fake.bodies) == 2
    assert fake.bodies[0] == fake.bodies[1]
    event = fake.bodies[1]
    assert event["type"] == "handoff.requested"
    assert (event["agent"], event["channel"], event["customer"]) == ("shop", "whatsapp", "Ann")
    assert event["conversation_id"] == conversation
    assert event["console_url"] == f"https://support.example/admin/conversations/{conversation}"
    assert "31612345678" not in fake.raw[1].decode()  # never the customer's phone number

    [row] = await Notifications(database.pool).recent()
    assert (row.status, row.attempts, row.last_status_code) == ("delivered", 2, 204)
    assert row.delivered_at is not None
    attempts = await Notifications(database.pool).attempts(row.id)
    assert [(a["status_code"], a["error"]) for a in attempts] == [(500, "HTTP 500"), (204, None)]


async def test_without_a_webhook_nothing_is_sent(
    database: Database, receiver: tuple[Receiver, str]
) -> None:
    fake, _ = receiver
    conversation = await _conversation(database, "telegram", "777", handle="ann_k")
    await HandoffStore(database.pool).change_status(conversation, "waiting_for_staff", author=None)
    async with aiohttp.ClientSession() as http:
        assert await _notifier(database, None).once(http) == 0
    assert fake.bodies == []
    [row] = await Notifications(database.pool).recent()
    assert (row.status, row.attempts, row.customer) == ("skipped", 0, "@ann_k")


async def test_a_message_unanswered_longer_than_the_set_time_is_an_event(
    database: Database, receiver: tuple[Receiver, str]
) -> None:
    fake, url = receiver
    fake.fail_first = 0
    late = await _conversation(database, "whatsapp", PHONE, name="Bo")
    await _message(database, late, "visitor", minutes_ago=11)
    answered = await _conversation(database, "whatsapp", "whatsapp:+3100", name="Cy")
    await _message(database, answered, "visitor", minutes_ago=12)
    await _message(database, answered, "assistant", minutes_ago=11.9)
    recent = await _conversation(database, "web", "web-session-1")
    await _message(database, recent, "visitor", minutes_ago=5)
    playground = await _conversation(database, "playground", "p-1")
    await _message(database, playground, "visitor", minutes_ago=30)

    store = Notifications(database.pool)
    assert await store.waiting_count(600) == 1
    async with aiohttp.ClientSession() as http:
        await _notifier(database, url).once(http)
        await _notifier(database, url).once(http)  # told once per wait, not every round
    assert [(b["type"], b["conversation_id"], b["customer"]) for b in fake.bodies] == [
        ("conversation.waiting", late, "Bo")
    ]


async def test_the_console_count_follows_a_conversation_that_starts_waiting(
    make_settings: MakeSettings, database: Database
) -> None:
    conversation = await _conversation(database, "web", "web-session-2", name="Dee")
    server = TestServer(create_app(make_settings(admin_token=TOKEN)))
    await server.start_server()
    try:
        headers = {"Authorization": f"Bearer {TOKEN}"}
        async with (
            httpx.AsyncClient(base_url=str(server.make_url("")), headers=headers) as client,
            aconnect_sse(client, "GET", "/admin/events/waiting") as source,
        ):
            events = (e async for e in source.aiter_sse() if e.data)  # not the retry: line
            first = await anext(events)
            assert (first.event, json.loads(first.data)) == ("waiting", {"count": 0})
            await HandoffStore(database.pool).change_status(
                conversation, "waiting_for_staff", author=None
            )
            seen = {}
            while len(seen) < 2:
                event = await anext(events)
                seen[event.event] = json.loads(event.data)
        assert seen["waiting"] == {"count": 1}
        assert seen["notification"]["type"] == "handoff.requested"
        assert seen["notification"]["customer"] == "Dee"
        assert seen["notification"]["url"] == f"/admin/conversations/{conversation}"

        async with httpx.AsyncClient(base_url=str(server.make_url(""))) as client:
            listed = await client.get("/api/v1/admin/notifications", headers=headers)
            refused = await client.get("/admin/events/waiting")
        assert listed.status_code == 200
        assert [i["conversation_id"] for i in listed.json()["items"]] == [conversation]
        assert listed.json()["webhook"] is False
        assert refused.status_code in (302, 303, 401)
    finally:
        await server.close()
