"""Redis is a cache, never a dependency of an answer: every channel answers while it is down.

The gateway runs as `parley serve` does (workers in-process) against a Redis server of the
test's own, which the test kills, cuts off and brings back; PostgreSQL stays up throughout.
"""

from __future__ import annotations

import json
import signal
import subprocess
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import httpx
import pytest
import redis.asyncio as aioredis
from aiohttp.test_utils import TestServer
from httpx_sse import aconnect_sse
from twilio.request_validator import RequestValidator

from core.knowledge.ingest import Ingestor
from core.knowledge.sources import parse_source
from core.retrieval.embedders import UseEmbedder
from core.store import Agent, Agents, Database
from core.store.api_keys import ApiKeys
from core.store.knowledge import KnowledgeStore
from core.store.vector_index import EmbedderIdentity
from gateway.app import create_app
from tests.conftest import MakeSettings
from tests.fakes.telegram import FakeTelegram
from tests.fakes.twilio import FakeTwilio
from tests.support.cli import PARLEY, clean_env
from tests.support.services import RedisServer
from tests.support.sse import Stream, chat
from tests.support.waiting import wait_until

PAGES = [
    {"url": "/en/shipping", "title": "Shipping", "lang": "en",
     "text": "# Shipping\nOrders to Belgium arrive in 2-3 working days. Shipping costs 4.95 euro."},
    {"url": "/en/returns", "title": "Returns", "lang": "en",
     "text": "# Returns\nYou can return any item within 30 days. Refunds arrive within 5 working days."},
]  # fmt: skip
WHATSAPP_FROM = "whatsapp:+14155238886"
TELEGRAM_SECRET = "outage-secret-0123456789-abcdefghijklmn"
ADMIN_TOKEN = "admin-token-for-outage-tests-0123"
# Per-session bucket: three messages, then (practically) no refill during a test.
SESSION_LIMIT = [0.001, 3]


@dataclass
class Gateway:
    url: str
    agent: Agent
    database: Database
    redis: RedisServer
    prefix: str
    api_key: str
    twilio: FakeTwilio
    telegram: FakeTelegram

    async def chat(self, message: str, session: str) -> Stream:
        return await chat(self.url, "shop", message, key=self.agent.widget_key, session_id=session)

    async def ask(self, message: str, session: str) -> dict[str, Any]:
        """A widget turn that must be answered; its ``done`` event."""
        stream = await self.chat(message, session)
        assert stream.status == 200, stream.events
        assert "error" not in stream.kinds(), stream.events
        return stream.data("done")

    async def api_turn(self, message: str, session: str) -> httpx.Response:
        async with httpx.AsyncClient(base_url=self.url, timeout=60) as client:
            return await client.post(
                "/api/v1/agents/shop/turns",
                json={"message": message, "session_id": session},
                headers={"Authorization": f"Bearer {self.api_key}"},
            )

    async def whatsapp(self, sid: str, sender: str, body: str) -> None:
        url = f"{self.url}/webhooks/twilio/shop"
        fields = {
            "MessageSid": sid, "AccountSid": self.twilio.account_sid, "From": sender,
            "To": WHATSAPP_FROM, "Body": body, "NumMedia": "0",
        }  # fmt: skip
        signature = RequestValidator(self.twilio.auth_token).compute_signature(url, fields)
        async with (
            aiohttp.ClientSession() as session,
            session.post(url, data=fields, headers={"X-Twilio-Signature": signature}) as response,
        ):
            assert response.status == 200

    async def telegram_update(self, update_id: int, chat_id: int, text: str) -> None:
        update = {
            "update_id": update_id,
            "message": {
                "message_id": update_id, "date": 1_717_000_000, "text": text,
                "from": {"id": chat_id, "is_bot": False, "first_name": "Anna"},
                "chat": {"id": chat_id, "first_name": "Anna", "type": "private"},
            },
        }  # fmt: skip
        async with (
            aiohttp.ClientSession() as session,
            session.post(
                f"{self.url}/webhooks/telegram/shop",
                json=update,
                headers={"X-Telegram-Bot-Api-Secret-Token": TELEGRAM_SECRET},
            ) as response,
        ):
            assert response.status == 200

    async def first_live_event(self, session: str) -> tuple[str, dict[str, Any]]:
        """Opens the widget's live stream (staff replies) and reads its first event."""
        async with (
            httpx.AsyncClient(base_url=self.url, timeout=10) as client,
            aconnect_sse(
                client,
                "GET",
                "/api/v1/agents/shop/conversations/events",
                params={"session_id": session, "key": self.agent.widget_key},
            ) as source,
        ):
            assert source.response.status_code == 200
            async for event in source.aiter_sse():
                if event.data:
                    return event.event, json.loads(event.data)
        raise AssertionError("the stream ended without an event")

    async def readyz(self) -> tuple[int, dict[str, Any]]:
        async with httpx.AsyncClient(base_url=self.url) as client:
            response = await client.get("/readyz")
            return response.status_code, response.json()

    async def keys(self) -> set[str]:
        """The gateway's keys in Redis, without their prefix."""
        async with aioredis.Redis.from_url(self.redis.url, decode_responses=True) as client:
            found = await client.keys(self.prefix + "*")
        return {key.removeprefix(self.prefix) for key in found}

    async def memory_of(self, turn_id: int) -> dict[str, Any]:
        """What the turn knew of its conversation, as its trace recorded it."""
        trace = await self.database.pool.fetchval("SELECT trace FROM turns WHERE id = $1", turn_id)
        memory: dict[str, Any] = trace["memory"]
        return memory


async def _shop(database: Database, embedder: UseEmbedder, tmp_path: Path) -> Agent:
    agents = Agents(database.pool)
    await agents.create("shop", embedder=EmbedderIdentity.of(embedder))
    agent = await agents.update(
        "shop",
        allowed_origins=["https://shop.example"],
        contact_route="hello@shop.example",
        settings={"rate_limits": {"session": SESSION_LIMIT}},
    )
    path = tmp_path / "pages.jsonl"
    path.write_text("\n".join(json.dumps(p) for p in PAGES), encoding="utf-8")
    await Ingestor(KnowledgeStore(database.pool), embedder).ingest(agent, parse_source(str(path)))
    return await agents.get("shop")


StartGateway = Callable[[], Awaitable[Gateway]]


@pytest.fixture
async def start_gateway(
    make_settings: MakeSettings,
    database: Database,
    use_embedder: UseEmbedder,
    private_redis: RedisServer,
    tmp_path: Path,
) -> AsyncIterator[StartGateway]:
    """Starts `parley serve`'s app (workers in-process) on the test's own Redis, with the
    WhatsApp and Telegram APIs faked; call it after stopping Redis to start without it."""
    agent = await _shop(database, use_embedder, tmp_path)
    api_key = await ApiKeys(database.pool).create(agent.id, "crm")
    twilio, telegram = FakeTwilio(), FakeTelegram()
    servers = [TestServer(twilio.app()), TestServer(telegram.app())]
    for server in servers:
        await server.start_server()
    prefix = "outage:"

    async def start() -> Gateway:
        settings = make_settings(
            redis_url=private_redis.url,
            redis_prefix=prefix,
            admin_token=ADMIN_TOKEN,
            burst_window_seconds=0,
            jobs=False,
            twilio_account_sid=twilio.account_sid,
            twilio_auth_token=twilio.auth_token,
            twilio_whatsapp_from=WHATSAPP_FROM,
            twilio_api_base=str(servers[0].make_url("")).rstrip("/"),
            telegram_bot_token=telegram.token,
            telegram_webhook_secret=TELEGRAM_SECRET,
            telegram_api_base=str(servers[1].make_url("")).rstrip("/"),
        )
        gateway = TestServer(create_app(settings, background=True))
        await gateway.start_server()
        servers.append(gateway)
        url = str(gateway.make_url("")).rstrip("/")
        return Gateway(url, agent, database, private_redis, prefix, api_key, twilio, telegram)

    yield start
    for server in reversed(servers):
        await server.close()


async def test_every_channel_answers_while_redis_is_down_and_uses_it_again_once_back(
    start_gateway: StartGateway,
) -> None:
    gw = await start_gateway()
    first = await gw.ask("How long does delivery to Belgium take?", "visitor-0001")
    assert "2-3 working days" in first["answer"]
    assert any(key.startswith("retrieval:") for key in await gw.keys())

    gw.redis.kill()

    # The widget, for a new visitor and as a follow-up in a conversation Redis had cached.
    fresh = await gw.ask("How much does shipping cost?", "visitor-0002")
    assert "4.95" in fresh["answer"]
    follow_up = await gw.ask("And how long can I return it?", "visitor-0001")  # rewritten
    assert follow_up["answer"]
    memory = await gw.memory_of(follow_up["turn_id"])
    assert (memory["source"], memory["messages"]) == ("postgres", 2)  # rebuilt from PostgreSQL

    # The JSON API.
    response = await gw.api_turn("Within how many days can I return something?", "crm-1")
    assert response.status_code == 200, response.text
    assert "30 days" in response.json()["answer"]

    # WhatsApp and Telegram: acknowledged, then answered by the in-process workers.
    await gw.whatsapp("SM" + "7" * 32, "whatsapp:+31612345678", "How much does shipping cost?")
    await gw.telegram_update(900_001, 555_000_111, "Within how many days can I return something?")

    async def both_answered() -> bool:
        return bool(gw.twilio.messages) and bool(gw.telegram.messages)

    await wait_until(both_answered, timeout=30.0)
    assert "4.95" in gw.twilio.messages[0]["body"]
    assert "30 days" in gw.telegram.messages[0]["text"]
    statuses = await gw.database.pool.fetch("SELECT status, attempts FROM inbox")
    assert [(r["status"], r["attempts"]) for r in statuses] == [("done", 0), ("done", 0)]

    # The widget's live stream of staff replies (PostgreSQL LISTEN, limited in-process).
    assert await gw.first_live_event("visitor-0001") == ("state", {"status": "bot"})

    # Ready (PostgreSQL answers), and saying that Redis does not.
    status, body = await gw.readyz()
    assert status == 200
    assert body["status"] == "degraded"
    assert body["checks"]["database"] == "ok"
    assert body["checks"]["cache (redis)"].startswith("degraded: redis is unreachable")

    # "New conversation" clears the memory kept in PostgreSQL.
    async with httpx.AsyncClient(base_url=gw.url) as client:
        cleared = await client.post(
            "/api/v1/agents/shop/conversations/clear",
            json={"session_id": "visitor-0001"},
            headers={"X-Parley-Key": gw.agent.widget_key},
        )
    assert cleared.status_code == 204

    # Back, empty, on the same address: used again without a restart of the gateway.
    gw.redis.start()
    assert await gw.readyz() == (
        200,
        {"status": "ready", "checks": {"database": "ok", "cache (redis)": "ok"}},
    )
    again = await gw.ask("How much does shipping cost?", "visitor-0003")
    assert "4.95" in again["answer"]
    keys = await gw.keys()
    assert any(key.startswith("retrieval:") for key in keys)
    assert any(key.startswith("rate:web:") for key in keys)
    second = await gw.ask("And how long does delivery take?", "visitor-0003")
    third = await gw.ask("Can I return it?", "visitor-0003")
    assert (await gw.memory_of(second["turn_id"]))["source"] == "postgres"  # nothing cached yet
    assert await gw.memory_of(third["turn_id"]) == {
        "source": "cache", "generation": 0, "messages": 4, "summary": False,
    }  # fmt: skip
    cleared_memory = await gw.ask("How much does shipping cost?", "visitor-0001")
    assert (await gw.memory_of(cleared_memory["turn_id"]))["messages"] == 0


async def test_a_gateway_started_while_redis_is_down_answers_and_takes_redis_up_when_it_answers(
    start_gateway: StartGateway, private_redis: RedisServer
) -> None:
    private_redis.kill()
    gw = await start_gateway()
    done = await gw.ask("How long does delivery to Belgium take?", "visitor-0001")
    assert "2-3 working days" in done["answer"]
    status, body = await gw.readyz()
    assert (status, body["status"]) == (200, "degraded")

    private_redis.start()
    assert (await gw.readyz())[1]["status"] == "ready"
    await gw.ask("How long does delivery to Belgium take?", "visitor-0002")
    assert any(key.startswith("retrieval:") for key in await gw.keys())


async def test_rate_limits_hold_in_the_process_while_redis_is_down(
    start_gateway: StartGateway,
) -> None:
    gw = await start_gateway()
    gw.redis.kill()
    statuses = [(await gw.chat("Shipping to Belgium?", "session-burst")).status for _ in range(4)]
    assert statuses == [200, 200, 200, 429]
    assert (await gw.chat("Shipping to Belgium?", "session-calm")).status == 200

    # Staff sign-in: the right token signs in, and guessing is still limited per address.
    async with httpx.AsyncClient(base_url=gw.url) as client:
        signed_in = await client.post("/api/v1/admin/sign-in", json={"token": ADMIN_TOKEN})
        assert signed_in.status_code == 200
        guesses = [
            (await client.post("/api/v1/admin/sign-in", json={"token": "wrong"})).status_code
            for _ in range(11)
        ]
    assert guesses == [401] * 5 + [429] * 6  # the back-off after five wrong in a row

    gw.redis.start()
    assert (await gw.readyz())[1]["status"] == "ready"
    assert (await gw.chat("Shipping to Belgium?", "session-later")).status == 200
    keys = await gw.keys()
    assert f"rate:web:{gw.agent.id}:session:session-later" in keys


async def _cut_off(redis: aioredis.Redis) -> None:
    """Redis refuses the gateway but keeps its data, as behind a network partition."""
    await redis.config_set("requirepass", "partition")
    await redis.execute_command("CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes")


async def test_what_redis_missed_while_cut_off_is_never_read_from_it_afterwards(
    start_gateway: StartGateway, private_redis: RedisServer
) -> None:
    gw = await start_gateway()
    for session in ("visitor-0001", "visitor-0002"):
        await gw.ask("How long does delivery to Belgium take?", session)
        await gw.ask("And how much does it cost?", session)  # rebuilt and cached from here on
    async with aioredis.Redis.from_url(private_redis.url, decode_responses=True) as admin:
        await _cut_off(admin)
        # Answered without Redis, which misses this turn and this clear.
        missed = await gw.ask("Can I return it?", "visitor-0001")
        assert (await gw.memory_of(missed["turn_id"]))["messages"] == 4
        async with httpx.AsyncClient(base_url=gw.url) as client:
            cleared = await client.post(
                "/api/v1/agents/shop/conversations/clear",
                json={"session_id": "visitor-0002"},
                headers={"X-Parley-Key": gw.agent.widget_key},
            )
        assert cleared.status_code == 204
        assert (await gw.readyz())[1]["status"] == "degraded"
        await admin.config_set("requirepass", "")

    assert (await gw.readyz())[1]["status"] == "ready"
    after = await gw.ask("How long do refunds take?", "visitor-0001")
    memory = await gw.memory_of(after["turn_id"])
    assert (memory["source"], memory["messages"]) == ("postgres", 6)  # not Redis' stale four
    fresh_start = await gw.ask("How long does delivery to Belgium take?", "visitor-0002")
    assert (await gw.memory_of(fresh_start["turn_id"]))["messages"] == 0


def test_parley_worker_starts_while_redis_is_down(
    tmp_path: Path, database_url: str, private_redis: RedisServer
) -> None:
    private_redis.kill()
    process = subprocess.Popen(
        [PARLEY, "worker"],
        cwd=tmp_path,
        env=clean_env(PARLEY_DATABASE_URL=database_url, PARLEY_REDIS_URL=private_redis.url),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert process.stdout is not None
        before = []
        for line in process.stdout:
            before.append(line)
            if "worker.started" in line:
                break
        else:
            raise AssertionError("the worker never said it started:\n" + "".join(before))
        process.send_signal(signal.SIGTERM)
        rest, _ = process.communicate(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == 0
    assert sum("cache.unavailable" in line for line in before) == 1
    assert "Traceback" not in "".join(before) + rest
