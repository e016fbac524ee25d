"""A shop with real conversations on several channels, for the staff console's tests.

Every conversation is answered by the real pipeline (extractive, no LLM), so turns, traces,
content gaps and the waiting-for-staff flag are what production would have stored.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import ClientResponse
from aiohttp.test_utils import TestClient

from channels.registry import secret_fields
from core.answer.factory import build_pipeline
from core.keyring import Keyring
from core.knowledge.ingest import Ingestor
from core.knowledge.sources import parse_source
from core.ports import Cache, Embedder
from core.settings import Settings
from core.store import Agent, Agents, Database
from core.store.answer_checks import AnswerChecks, NewResult
from core.store.curated import CuratedAnswers
from core.store.job_runs import JobRuns
from core.store.knowledge import KnowledgeStore
from core.store.memory import MemoryStore
from core.store.vector_index import EmbedderIdentity
from core.turns import CollectingTurnOutput, TurnRequest

TOKEN = "admin-token-for-console-tests-0123456789"
PASSWORD = "correct horse battery staple"
STAFF_EMAIL = "sam@shop.example"
TWILIO_TOKEN = "twilio-auth-token-that-is-secret"
TWILIO_SID = "AC" + "0123456789abcdef" * 2
BOT_TOKEN = "123456:ABCDEFGHIJKLMNOPQRSTUVWXYZsecret"
WEBHOOK_SECRET = "telegram-webhook-secret-value"
SECRETS = (TOKEN, PASSWORD, TWILIO_TOKEN, BOT_TOKEN, WEBHOOK_SECRET)

WHATSAPP = "whatsapp:+31612345678"
TELEGRAM = "777000111"
SUMMARY = (
    "Customer wants to know what shipping to Belgium costs.\n"
    "Was told 4.95 euro and 2-3 working days.\n"
    "Still open: whether bicycles are repaired."
)

PAGES = [
    {"url": "https://shop.example/en/faq", "title": "FAQ", "lang": "en",
     "text": "# FAQ\n## Delivery to Belgium\nHow long does delivery to Belgium take? Parcels to Belgium are delivered within 2-3 working days by bpost."},
    {"url": "https://shop.example/en/shipping", "title": "Shipping", "lang": "en",
     "text": "# Shipping\nOrders to Belgium arrive in 2-3 working days. Shipping costs 4.95 euro."},
    {"url": "https://shop.example/en/returns", "title": "Returns", "lang": "en",
     "text": "# Returns\nYou can return any item within 30 days. Refunds arrive within 5 working days."},
]  # fmt: skip

# (channel, conversation key, messages): asked in this order.
CHATS = [
    ("whatsapp", WHATSAPP, ["What does shipping to Belgium cost?", "Do you repair bicycles?"]),
    ("telegram", TELEGRAM, ["Can I return an item?", "I want to talk to a human"]),
    ("web", "web-session-0001", ["How long does delivery to Belgium take?"]),
    ("web", "web-session-0002", ["do you repair bicycles", "Do you sell kayaks?"]),
    ("api", "api-customer-42", ["Can I return an item after 30 days?"]),
]


@dataclass
class Seeded:
    agent: Agent
    other: Agent
    conversations: dict[str, int]  # conversation key -> id
    curated_id: int
    check_ids: tuple[int, int]
    failed_source_id: int


async def seed(
    settings: Settings, database: Database, cache: Cache, embedder: Embedder, tmp_path: Path
) -> Seeded:
    pool = database.pool
    agents = Agents(pool, keyring=Keyring.from_settings(settings), secret_fields=secret_fields())
    identity = EmbedderIdentity.of(embedder)
    await agents.create(
        "shop", embedder=identity, name="Noordkaap Shop", timezone="Europe/Amsterdam"
    )
    await agents.create("help", embedder=identity, name="Help Desk", timezone="UTC")
    agent = await agents.update(
        "shop",
        allowed_origins=["https://shop.example"],
        contact_route="hello@shop.example",
        confidence_threshold=0.5,
        settings={
            "twilio": {
                "account_sid": TWILIO_SID,
                "auth_token": TWILIO_TOKEN,
                "whatsapp_from": "whatsapp:+3197010000000",
            },
            "telegram": {"bot_token": BOT_TOKEN, "webhook_secret": WEBHOOK_SECRET},
        },
    )
    pages = tmp_path / "pages.jsonl"
    pages.write_text("\n".join(json.dumps(p) for p in PAGES), encoding="utf-8")
    store = KnowledgeStore(pool)
    await Ingestor(store, embedder).ingest(agent, parse_source(str(pages)))
    failed = await store.upsert_source(agent.id, "url", "https://shop.example/broken")
    await store.set_source_status(failed, "failed", "HTTP 404 from https://shop.example/broken")

    curated = CuratedAnswers(pool)
    curated_id = await curated.create(
        agent.id,
        "Our shop in Utrecht is open Monday to Saturday, 10:00-18:00.",
        question="When is the shop open?",
        keywords=("opening hours",),
    )
    await curated.count_hit(curated_id)
    await curated.count_hit(curated_id)

    conversations: dict[str, int] = {}
    async with aiohttp.ClientSession() as session:
        pipeline = build_pipeline(settings, pool, cache, embedder, session, None)
        for channel, key, messages in CHATS:
            for text in messages:
                output = CollectingTurnOutput()
                await pipeline.run(
                    TurnRequest(agent="shop", channel=channel, conversation_key=key, text=text),
                    output,
                )
                assert output.error is None, output.error
        await pipeline.memory.drain()
    # Set only now: with hours, which text a visitor asking for a person gets depends on
    # the clock, and the chats above must not.
    hours = {"mon": ["09:00-17:30"], "sat": "closed"}
    agent = await agents.update("shop", settings={**agent.settings, "business_hours": hours})
    for row in await pool.fetch("SELECT id, conversation_key FROM conversations"):
        conversations[row["conversation_key"]] = row["id"]
    await pool.execute(
        "UPDATE conversations SET customer_name = 'Anna de Vries' WHERE id = $1",
        conversations[TELEGRAM],
    )
    whatsapp = conversations[WHATSAPP]
    last = await pool.fetchval("SELECT max(id) FROM messages WHERE conversation_id = $1", whatsapp)
    assert await MemoryStore(pool).save_summary(whatsapp, 0, SUMMARY, last)

    checks = AnswerChecks(pool)
    passing = await checks.create(
        agent.id, "How long does delivery to Belgium take?", expected_facts=["2-3 working days"]
    )
    failing = await checks.create(
        agent.id, "Do you sell gift cards?", must_cite="https://shop.example/en/gift-cards"
    )
    run = await JobRuns(pool).start("answer_checks", trigger="manual", slot=None, instance="t")
    assert run is not None
    await checks.record(
        run.id,
        NewResult(passing.id, agent.id, True, "Parcels arrive in 2-3 working days [1].",
                  cited_urls=("https://shop.example/en/faq",), confidence=0.8),
    )  # fmt: skip
    await checks.record(
        run.id,
        NewResult(failing.id, agent.id, False, "I could not verify that.", cited_ok=False,
                  confidence=0.1),
    )  # fmt: skip
    return Seeded(
        agent=agent,
        other=await agents.get("help"),
        conversations=conversations,
        curated_id=curated_id,
        check_ids=(passing.id, failing.id),
        failed_source_id=failed,
    )


_META_CSRF = re.compile(r'<meta name="csrf-token" content="([^"]*)">')
_FORM_TOKEN = re.compile(r'name="form_token" value="([^"]+)"')


def csrf_of(html: str) -> str:
    found = _META_CSRF.search(html)
    assert found is not None, "no CSRF token on the page"
    return found.group(1)


def form_token_of(html: str) -> str:
    found = _FORM_TOKEN.search(html)
    assert found is not None, "no form token on the sign-in page"
    return found.group(1)


async def sign_in(client: TestClient[Any, Any], **fields: str) -> ClientResponse:
    """Sign in to the console (``token=...`` or ``email=..., password=...``); the answer."""
    page = await client.get("/admin/sign-in")
    assert page.status == 200
    token = form_token_of(await page.text())
    return await client.post(
        "/admin/sign-in", data={"form_token": token, **fields}, allow_redirects=False
    )
