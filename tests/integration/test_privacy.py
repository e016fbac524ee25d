"""Privacy requests: a customer's data erased or exported (admin API, CLI), the audit that
names no one, and logs at INFO that hold neither a customer's number nor their words."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg
import pytest
from aiohttp import DummyCookieJar, web
from aiohttp.test_utils import TestClient, TestServer
from twilio.request_validator import RequestValidator

from core.keyring import Keyring
from core.knowledge.ingest import Ingestor
from core.knowledge.sources import parse_source
from core.ports import Cache
from core.retrieval.embedders import UseEmbedder
from core.settings import Settings
from core.store.agents import Agents
from core.store.inbox_work import InboxWork
from core.store.knowledge import KnowledgeStore
from core.store.staff import StaffAccounts
from core.store.vector_index import EmbedderIdentity
from gateway.app import create_app
from gateway.keys import CACHE, DATABASE
from tests.conftest import MakeSettings
from tests.fakes.twilio import FakeTwilio
from tests.support.cli import run_parley

Client = TestClient[web.Request, web.Application]

API = "/api/v1/admin"
TOKEN = "admin-token-for-privacy-tests-0123456789"
PASSWORD = "correct horse battery staple"
BEARER = {"Authorization": f"Bearer {TOKEN}"}

# Each customer erased, and beside it customers it must not touch: a longer number, the
# same id on another channel, the same id at another agent.
CUSTOMERS = {
    "whatsapp": "whatsapp:+31612345678",
    "telegram": "777000111",
    "web": "web-session-0001",
}
NEIGHBOURS = [
    ("shop", "whatsapp", "whatsapp:+316123456789"),
    ("shop", "whatsapp", "whatsapp:+3161234567"),
    ("shop", "telegram", "7770001110"),
    ("shop", "web", "web-session-00011"),
    ("shop", "telegram", "whatsapp:+31612345678"),
    ("help", "whatsapp", "whatsapp:+31612345678"),
]


@dataclass
class Shop:
    client: Client
    pool: asyncpg.Pool
    cache: Cache
    settings: Settings


@pytest.fixture
async def shop(make_settings: MakeSettings, use_embedder: UseEmbedder) -> AsyncIterator[Shop]:
    settings = make_settings(admin_token=TOKEN)
    client: Client = TestClient(TestServer(create_app(settings)), cookie_jar=DummyCookieJar())
    await client.start_server()
    pool = client.server.app[DATABASE].pool
    agents = Agents(pool, keyring=Keyring.from_settings(settings))
    identity = EmbedderIdentity.of(use_embedder)
    await agents.create("shop", embedder=identity)
    await agents.create("help", embedder=identity)
    yield Shop(client, pool, client.server.app[CACHE], settings)
    await client.close()


async def _customer(shop: Shop, agent: str, channel: str, key: str) -> int:
    """A conversation as the pipeline and staff leave it: turn with trace, messages, summary,
    a content gap, feedback, inbox and outbox rows, a resolving and cached memory, all quoting
    the customer."""
    pool = shop.pool
    agent_id = await pool.fetchval("SELECT id FROM agents WHERE slug = $1", agent)
    question = f"Where is my parcel ({channel}), says {key}?"
    conversation = await pool.fetchval(
        """INSERT INTO conversations (agent_id, channel, conversation_key, customer_name, status)
           VALUES ($1, $2, $3, 'Anna de Vries', 'waiting_for_staff') RETURNING id""",
        agent_id,
        channel,
        key,
    )
    turn = await pool.fetchval(
        """INSERT INTO turns (conversation_id, agent_id, channel, query, confidence, trace)
           VALUES ($1, $2, $3, $4, 0.2, $5) RETURNING id""",
        conversation,
        agent_id,
        channel,
        question,
        {"sources": [{"id": 1, "url": "https://shop.example/en/shipping"}]},
    )
    await pool.execute(
        """INSERT INTO messages (conversation_id, role, text, turn_id) VALUES
           ($1, 'visitor', $2, $3), ($1, 'assistant', 'Parcels arrive in 2-3 days.', $3)""",
        conversation,
        question,
        turn,
    )
    last = await pool.fetchval(
        "SELECT max(id) FROM messages WHERE conversation_id = $1", conversation
    )
    await pool.execute(
        "INSERT INTO summaries (conversation_id, text, through_message, generation) "
        "VALUES ($1, $2, $3, 0)",
        conversation,
        f"{key} asked about a parcel.",
        last,
    )
    await pool.execute(
        "INSERT INTO content_gaps (agent_id, turn_id, question, reason, confidence) "
        "VALUES ($1, $2, $3, 'weak_match', 0.2)",
        agent_id,
        turn,
        question,
    )
    await pool.execute(
        "INSERT INTO feedback (agent_id, conversation_id, turn_id, channel, rating, comment) "
        "VALUES ($1, $2, $3, $4, 'down', $5)",
        agent_id,
        conversation,
        turn,
        channel,
        f"not helpful, {key}",
    )
    await pool.execute(
        """INSERT INTO inbox (agent_id, channel, provider_message_id, conversation_key,
                              payload, message, status)
           VALUES ($1, $2, $3, $4, $5, $6, 'done')""",
        agent_id,
        channel,
        f"SM-{agent}-{channel}-{key}",
        key,
        {"From": key, "Body": question},
        {"customer_id": key, "text": question},
    )
    await pool.execute(
        """INSERT INTO outbox (agent_id, channel, conversation_id, recipient, body, status)
           VALUES ($1, $2, $3, $4, 'Parcels arrive in 2-3 days.', 'sent')""",
        agent_id,
        channel,
        conversation,
        key,
    )
    await InboxWork(pool).set_status(conversation, "resolved", "ada@shop.example")
    await shop.cache.set(f"memory:{conversation}", "0", ttl=600)
    await shop.cache.set(f"memory:{conversation}:0:summary", json.dumps({"text": key}), ttl=600)
    return int(conversation)


async def _held(pool: asyncpg.Pool, agent: str, channel: str, key: str) -> dict[str, int]:
    """How many rows of each kind Postgres holds of a customer."""
    agent_id = await pool.fetchval("SELECT id FROM agents WHERE slug = $1", agent)
    where = "agent_id = $1 AND channel = $2 AND conversation_key = $3"
    ids = f"(SELECT id FROM conversations WHERE {where})"
    counts = {}
    for name, sql in {
        "conversations": f"SELECT count(*) FROM conversations WHERE {where}",
        "messages": f"SELECT count(*) FROM messages WHERE conversation_id IN {ids}",
        "turns": f"SELECT count(*) FROM turns WHERE conversation_id IN {ids}",
        "inbox": f"SELECT count(*) FROM inbox WHERE {where}",
        "outbox": "SELECT count(*) FROM outbox WHERE agent_id = $1 AND channel = $2 "
        "AND recipient = $3",
        "gaps": "SELECT count(*) FROM content_gaps WHERE agent_id = $1 "
        "AND question = 'Where is my parcel (' || $2 || '), says ' || $3 || '?'",
        "feedback": "SELECT count(*) FROM feedback WHERE agent_id = $1 AND channel = $2 "
        "AND comment = 'not helpful, ' || $3",
        "resolutions": "SELECT count(*) FROM conversation_resolutions "
        f"WHERE conversation_id IN {ids}",
    }.items():
        counts[name] = await pool.fetchval(sql, agent_id, channel, key)
    return counts


async def _signed_in(client: Client, email: str) -> dict[str, str]:
    response = await client.post(f"{API}/sign-in", json={"email": email, "password": PASSWORD})
    assert response.status == 200, await response.text()
    body = await response.json()
    return {
        "Cookie": f"parley_admin={response.cookies['parley_admin'].value}",
        "X-CSRF-Token": body["csrf_token"],
    }


async def test_erase_removes_one_customer_everywhere_and_the_audit_names_no_one(
    shop: Shop,
) -> None:
    client, pool = shop.client, shop.pool
    erased_ids = {c: await _customer(shop, "shop", c, key) for c, key in CUSTOMERS.items()}
    kept_ids = [await _customer(shop, *n) for n in NEIGHBOURS]

    # An agent (role) may do neither; an admin account may.
    accounts = StaffAccounts(pool)
    await accounts.create("ada@shop.example", PASSWORD)  # the first account: an admin
    await accounts.create("sam@shop.example", PASSWORD)  # an agent
    agent = await _signed_in(client, "sam@shop.example")
    body = {"channel": "whatsapp", "id": CUSTOMERS["whatsapp"]}
    for response in (
        await client.post(f"{API}/agents/shop/customers/erase", json=body, headers=agent),
        await client.get(f"{API}/agents/shop/customers/export", params=body, headers=agent),
    ):
        assert response.status == 403
        assert (await response.json())["error"]["code"] == "role_required"
    assert (await _held(pool, "shop", "whatsapp", CUSTOMERS["whatsapp"]))["messages"] == 2
    admin = await _signed_in(client, "ada@shop.example")

    for channel, key in CUSTOMERS.items():
        response = await client.post(
            f"{API}/agents/shop/customers/erase",
            json={"channel": channel, "id": key},
            headers=admin if channel == "whatsapp" else BEARER,
        )
        assert response.status == 200, await response.text()
        answer = await response.json()
        assert answer["erased"] == {
            "conversations": 1, "messages": 2, "summaries": 1, "turns": 1, "content_gaps": 1,
            "feedback": 1, "inbox": 1, "outbox": 1,
        }  # fmt: skip
        assert answer["cached_memory_forgotten"] == 1
        assert answer["media"] == "none stored"
        assert set((await _held(pool, "shop", channel, key)).values()) == {0}
        conversation = erased_ids[channel]
        assert not await pool.fetchval(
            "SELECT count(*) FROM conversation_resolutions WHERE conversation_id = $1",
            conversation,
        )
        assert await shop.cache.get(f"memory:{conversation}") is None
        assert await shop.cache.get(f"memory:{conversation}:0:summary") is None

    # Nothing of anyone else went, however alike their ids.
    for agent_slug, channel, key in NEIGHBOURS:
        held = await _held(pool, agent_slug, channel, key)
        assert held == {
            "conversations": 1, "messages": 2, "turns": 1, "inbox": 1, "outbox": 1, "gaps": 1,
            "feedback": 1, "resolutions": 1,
        }, (agent_slug, channel, key)  # fmt: skip
    for conversation in kept_ids:
        assert await shop.cache.get(f"memory:{conversation}") == "0"
        assert await pool.fetchval(
            "SELECT count(*) FROM summaries WHERE conversation_id = $1", conversation
        )

    # The audit: who, when, which agent and channel, and counts; the customer only as a
    # hash keyed with the installation's key, never their id or words.
    rows = await pool.fetch("SELECT * FROM privacy_audit ORDER BY id")
    assert [(r["action"], r["staff"], r["agent"], r["channel"]) for r in rows] == [
        ("erase", "ada@shop.example", "shop", "whatsapp"),
        ("erase", "admin", "shop", "telegram"),
        ("erase", "admin", "shop", "web"),
    ]
    key_bytes = bytes(await pool.fetchval("SELECT key FROM privacy_key"))
    for row, (channel, key) in zip(rows, CUSTOMERS.items(), strict=True):
        expected = hmac.new(key_bytes, f"{channel}\x00{key}".encode(), hashlib.sha256)
        assert row["customer_hash"] == expected.hexdigest()
        assert row["counts"]["messages"] == 2
        stored = json.dumps({k: str(v) for k, v in dict(row).items()})
        assert key not in stored
        assert key.split(":")[-1] not in stored
        assert "parcel" not in stored
        assert "Anna" not in stored

    # Erasing again finds nothing and says so; it is audited all the same.
    again = await client.post(
        f"{API}/agents/shop/customers/erase",
        json={"channel": "whatsapp", "id": CUSTOMERS["whatsapp"]},
        headers=BEARER,
    )
    assert (await again.json())["erased"]["conversations"] == 0


async def test_export_gives_the_customers_conversations_without_traces_unless_asked(
    shop: Shop, tmp_path: Path
) -> None:
    client, pool = shop.client, shop.pool
    key = CUSTOMERS["whatsapp"]
    conversation = await _customer(shop, "shop", "whatsapp", key)
    await _customer(shop, "shop", "whatsapp", "whatsapp:+316123456789")
    url = f"{API}/agents/shop/customers/export"

    response = await client.get(url, params={"channel": "whatsapp", "id": key}, headers=BEARER)
    assert response.status == 200, await response.text()
    exported = await response.json()
    assert (exported["customer"], exported["channel"]) == (key, "whatsapp")
    [only] = exported["conversations"]
    assert only["id"] == conversation
    assert only["status"] == "waiting_for_staff"
    assert only["summary"] == f"{key} asked about a parcel."
    assert [(m["role"], m["text"]) for m in only["messages"]] == [
        ("visitor", f"Where is my parcel (whatsapp), says {key}?"),
        ("assistant", "Parcels arrive in 2-3 days."),
    ]
    assert all(m["created_at"] for m in only["messages"])
    assert only["turns"] is None
    assert "trace" not in json.dumps(exported)

    traced = await client.get(
        url, params={"channel": "whatsapp", "id": key, "traces": "true"}, headers=BEARER
    )
    [with_turns] = (await traced.json())["conversations"]
    assert with_turns["turns"][0]["trace"]["sources"][0]["url"].endswith("/en/shipping")

    nobody = await client.get(url, params={"channel": "telegram", "id": key}, headers=BEARER)
    assert (await nobody.json())["conversations"] == []
    bad = await client.get(url, params={"channel": "fax", "id": key}, headers=BEARER)
    assert bad.status == 400
    actions = await pool.fetch("SELECT action, counts FROM privacy_audit ORDER BY id")
    assert [a["action"] for a in actions] == ["export", "export", "export"]
    assert actions[0]["counts"] == {"conversations": 1, "messages": 2}

    # The CLI, as a user runs it: export prints the same JSON, erase removes and reports.
    env = {
        "PARLEY_DATABASE_URL": shop.settings.database_url.get_secret_value(),  # type: ignore[union-attr]
        "PARLEY_REDIS_URL": shop.settings.redis_url.get_secret_value(),  # type: ignore[union-attr]
        "PARLEY_REDIS_PREFIX": shop.settings.redis_prefix,
    }
    args = ("--agent", "shop", "--channel", "whatsapp", "--id", key)
    printed = await asyncio.to_thread(run_parley, "customer", "export", *args, cwd=tmp_path, **env)
    assert printed.returncode == 0, printed.stderr
    from_cli = json.loads(printed.stdout)
    assert from_cli["conversations"][0]["messages"] == only["messages"]
    erased = await asyncio.to_thread(run_parley, "customer", "erase", *args, cwd=tmp_path, **env)
    assert erased.returncode == 0, erased.stderr
    assert "1 conversations, 2 messages" in erased.stdout
    assert key not in erased.stdout
    assert (await _held(pool, "shop", "whatsapp", key))["messages"] == 0
    assert (await _held(pool, "shop", "whatsapp", "whatsapp:+316123456789"))["messages"] == 2
    assert await shop.cache.get(f"memory:{conversation}") is None
    last = await pool.fetchrow("SELECT staff, action FROM privacy_audit ORDER BY id DESC LIMIT 1")
    assert last["action"] == "erase"
    assert last["staff"].startswith("cli")


# -- logs -----------------------------------------------------------------------------------

PAGES = [
    {"url": "/en/returns", "title": "Returns", "lang": "en",
     "text": "# Returns\nYou can return any item within 30 days. Refunds arrive within 5 working days."},
]  # fmt: skip


async def test_a_whatsapp_turn_logs_neither_the_number_nor_the_words_at_info(
    make_settings: MakeSettings,
    use_embedder: UseEmbedder,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    number = "+31687654321"
    words = "Kan ik mijn fietsbel binnen dertig dagen retourneren"
    fake = FakeTwilio()
    twilio = TestServer(fake.app())
    await twilio.start_server()
    settings = make_settings(
        twilio_account_sid=fake.account_sid,
        twilio_auth_token=fake.auth_token,
        twilio_whatsapp_from="whatsapp:+14155238886",
        twilio_api_base=str(twilio.make_url("")).rstrip("/"),
    )
    gateway = TestServer(create_app(settings, background=True))
    await gateway.start_server()
    pool = gateway.app[DATABASE].pool
    agents = Agents(pool)
    agent = await agents.create("shop", embedder=EmbedderIdentity.of(use_embedder))
    path = tmp_path / "pages.jsonl"
    path.write_text("\n".join(json.dumps(p) for p in PAGES), encoding="utf-8")
    await Ingestor(KnowledgeStore(pool), use_embedder).ingest(agent, parse_source(str(path)))
    caplog.set_level(logging.INFO)
    try:
        url = str(gateway.make_url("/webhooks/twilio/shop"))
        fields = {
            "MessageSid": "SM" + "7" * 32, "AccountSid": fake.account_sid,
            "From": f"whatsapp:{number}", "To": "whatsapp:+14155238886", "Body": words,
            "NumMedia": "0", "ProfileName": "Sam",
        }  # fmt: skip
        signature = RequestValidator(fake.auth_token).compute_signature(url, fields)
        async with (
            aiohttp.ClientSession() as session,
            session.post(url, data=fields, headers={"X-Twilio-Signature": signature}) as response,
        ):
            assert response.status == 200
        for _ in range(300):
            if fake.messages and await pool.fetchval(
                "SELECT count(*) FROM outbox WHERE status = 'sent'"
            ):
                break
            await asyncio.sleep(0.05)
        assert fake.messages, "the answer was never sent"
    finally:
        await gateway.close()
        await twilio.close()
    records = [r for r in caplog.records if r.levelno >= logging.INFO]
    assert any(r.name.startswith(("channels", "core", "gateway")) for r in records)
    for record in records:
        said = record.getMessage() + " " + json.dumps(_extras(record), default=str)
        assert number[1:] not in said, said
        assert "fietsbel" not in said, said


def _extras(record: logging.LogRecord) -> dict[str, Any]:
    standard = logging.makeLogRecord({}).__dict__.keys()
    return {k: v for k, v in record.__dict__.items() if k not in standard and k != "message"}
