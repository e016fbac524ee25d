"""The console's privacy page in headless Chromium: export a customer as a download, then
erase them after typing their id again; the settings page says how long conversations stay."""

from __future__ import annotations

import json
from pathlib import Path

import asyncpg
from aiohttp.test_utils import TestServer
from playwright.async_api import Browser, expect

from core.keyring import Keyring
from core.retrieval.embedders import UseEmbedder
from core.store import Database
from core.store.agents import Agents
from core.store.vector_index import EmbedderIdentity
from gateway.app import create_app
from tests.conftest import MakeSettings
from tests.e2e.browser import chromium

TOKEN = "admin-token-for-privacy-console-0123456789"
CUSTOMER = "whatsapp:+31612345678"
NEIGHBOUR = "whatsapp:+316123456789"


async def _conversation(pool: asyncpg.Pool, agent_id: int, key: str, question: str) -> None:
    conversation = await pool.fetchval(
        "INSERT INTO conversations (agent_id, channel, conversation_key) "
        "VALUES ($1, 'whatsapp', $2) RETURNING id",
        agent_id,
        key,
    )
    await pool.execute(
        "INSERT INTO messages (conversation_id, role, text) VALUES "
        "($1, 'visitor', $2), ($1, 'assistant', 'Within 30 days.')",
        conversation,
        question,
    )


async def test_export_then_erase_a_customer_with_a_typed_confirmation(
    make_settings: MakeSettings, database: Database, use_embedder: UseEmbedder, tmp_path: Path
) -> None:
    settings = make_settings(admin_token=TOKEN, retention_days=30)
    pool = database.pool
    agents = Agents(pool, keyring=Keyring.from_settings(settings))
    agent = await agents.create("shop", embedder=EmbedderIdentity.of(use_embedder), name="Shop")
    await _conversation(pool, agent.id, CUSTOMER, "Can I return my bike bell?")
    await _conversation(pool, agent.id, NEIGHBOUR, "Do you sell kayaks?")
    server = TestServer(create_app(settings))
    await server.start_server()
    try:
        async with chromium() as browser:
            await _flow(browser, server, pool, tmp_path)
    finally:
        await server.close()


async def _flow(browser: Browser, server: TestServer, pool: asyncpg.Pool, shots: Path) -> None:
    page = await browser.new_page(viewport={"width": 1280, "height": 900}, accept_downloads=True)
    await page.goto(str(server.make_url("/admin")))
    await page.get_by_label("Admin token", exact=True).fill(TOKEN)
    await page.get_by_role("button", name="Sign in with the token", exact=True).click()
    await expect(page.get_by_role("heading", name="Conversations", exact=True)).to_be_visible()

    # Retention, read-only, on the settings page.
    await page.goto(str(server.make_url("/admin/agents/shop/settings")))
    await expect(page.locator(".retention-line")).to_have_text(
        "Conversations older than 30 days are deleted nightly."
    )
    await page.get_by_role("link", name="Privacy", exact=True).first.click()
    await expect(page.get_by_role("heading", name="Privacy · Shop")).to_be_visible()
    await page.screenshot(path=shots / "privacy-1280.png", full_page=True)

    export = page.get_by_role("region", name="Export a customer's data")
    await export.get_by_label("Channel").select_option("whatsapp")
    await export.get_by_label("Customer id", exact=True).fill(CUSTOMER)
    async with page.expect_download() as downloading:
        await export.get_by_role("button", name="Download export").click()
    download = await downloading.value
    assert CUSTOMER not in download.suggested_filename
    saved = await download.path()
    exported = json.loads(Path(saved).read_text(encoding="utf-8"))
    [conversation] = exported["conversations"]
    assert [(m["role"], m["text"]) for m in conversation["messages"]] == [
        ("visitor", "Can I return my bike bell?"),
        ("assistant", "Within 30 days."),
    ]

    erase = page.get_by_role("region", name="Erase a customer's data")
    await erase.get_by_label("Channel").select_option("whatsapp")
    await erase.get_by_label("Customer id", exact=True).fill(CUSTOMER)
    await erase.get_by_label("Type the customer id again to confirm").fill("whatsapp:+3161234567")
    await erase.get_by_role("button", name="Erase this customer's data").click()
    await expect(page.get_by_role("alert")).to_contain_text("type the customer id exactly")
    assert await pool.fetchval("SELECT count(*) FROM conversations") == 2
    await page.screenshot(path=shots / "privacy-refused-1280.png", full_page=True)

    erase = page.get_by_role("region", name="Erase a customer's data")
    await expect(erase.get_by_label("Customer id", exact=True)).to_have_value(CUSTOMER)
    await erase.get_by_label("Type the customer id again to confirm").fill(CUSTOMER)
    await erase.get_by_role("button", name="Erase this customer's data").click()
    done = page.get_by_role("region", name="Erased")
    await expect(done).to_contain_text("1 conversations, 2 messages")
    keys = [
        r["conversation_key"]
        for r in await pool.fetch("SELECT conversation_key FROM conversations")
    ]
    assert keys == [NEIGHBOUR]
    audit = page.locator("table.privacy-audit tbody tr")
    await expect(audit).to_have_count(2)  # the export, then the erasure
    await expect(audit.first).to_contain_text("Erased")
    await expect(page.locator("main")).not_to_contain_text(CUSTOMER)
    await page.screenshot(path=shots / "privacy-erased-1280.png", full_page=True)

    await page.set_viewport_size({"width": 360, "height": 780})
    await page.screenshot(path=shots / "privacy-erased-360.png", full_page=True)
    # Nothing wider than the phone: no sideways scrolling.
    assert await page.evaluate("document.documentElement.scrollWidth") <= 360
    await page.goto(str(server.make_url("/admin/agents/shop/privacy")))
    await page.screenshot(path=shots / "privacy-360.png", full_page=True)
    assert await page.evaluate("document.documentElement.scrollWidth") <= 360
    await page.close()
