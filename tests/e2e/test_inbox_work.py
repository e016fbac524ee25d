"""The inbox in headless Chromium: the list refreshing live, search, assign, a note, a saved
reply and resolve, at phone and desk widths."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiohttp.test_utils import TestServer
from playwright.async_api import Browser, expect

from channels.registry import secret_fields
from core.keyring import Keyring
from core.retrieval.embedders import UseEmbedder
from core.settings import Settings
from core.store import Agents, Database
from core.store.staff import StaffAccounts
from core.store.vector_index import EmbedderIdentity
from gateway.app import create_app
from tests.conftest import MakeSettings
from tests.e2e.browser import chromium
from tests.integration.test_inbox_work import PASSWORD, _conversation


@pytest.fixture
async def browser() -> AsyncIterator[Browser]:
    async with chromium() as launched:
        yield launched


async def test_live_list_search_assign_note_saved_reply_resolve(
    browser: Browser, make_settings: MakeSettings, settings: Settings, database: Database,
    use_embedder: UseEmbedder, tmp_path: Path,
) -> None:  # fmt: skip
    pool = database.pool
    agents = Agents(pool, keyring=Keyring.from_settings(settings), secret_fields=secret_fields())
    agent = await agents.create("shop", embedder=EmbedderIdentity.of(use_embedder), name="Shop")
    ada = await StaffAccounts(pool).create(
        "ada@shop.example", PASSWORD, display_name="Ada", role="admin"
    )
    marieke = await _conversation(pool, agent.id, "web", "session-marieke-1", "Marieke de Vries", [
        ("visitor", "Where is my parcel to Utrecht? It was due on Monday and I still have nothing."),
        ("assistant", "It ships tomorrow from our warehouse in Zwolle."),
    ])  # fmt: skip
    pieter = await _conversation(pool, agent.id, "telegram", "4242", "Pieter", [
        ("visitor", "Kan ik mijn jas retourneren?"),
    ])  # fmt: skip
    await pool.execute(
        "INSERT INTO saved_replies (agent_id, title, text) VALUES ($1, 'Thanks', $2)",
        agent.id, "Hi {{customer_name}}, {{agent_name}} here.",
    )  # fmt: skip
    server = TestServer(create_app(make_settings()))
    await server.start_server()
    try:
        page = await browser.new_page(viewport={"width": 1280, "height": 800})
        await page.goto(str(server.make_url("/admin/sign-in")))
        await page.locator("#email").fill("ada@shop.example")
        await page.locator("#password").fill(PASSWORD)
        await page.get_by_role("button", name="Sign in", exact=True).click()
        rows = page.locator("table.conversations tbody tr")
        await expect(rows).to_have_count(2)
        await expect(page.locator("tr .unread-dot")).to_have_count(2)
        await page.screenshot(path=tmp_path / "list-1280.png", full_page=True)

        # A new message arrives: the list shows it without a reload.
        await pool.execute(
            "INSERT INTO messages (conversation_id, role, text) VALUES ($1, 'visitor', $2)",
            pieter, "Is de winkel open op zondag?",
        )  # fmt: skip
        await expect(page.get_by_text("Is de winkel open op zondag?")).to_be_visible(timeout=8000)

        await page.locator("#filter-q").fill("Utrecht")
        await page.get_by_role("button", name="Filter").click()
        await expect(rows).to_have_count(1)
        await page.keyboard.press("j")  # shortcuts: choose the first, open it
        await page.keyboard.press("Enter")
        await expect(
            page.get_by_role("heading", name="Conversation with Marieke de Vries")
        ).to_be_visible()

        await page.get_by_role("button", name="Assign to me").click()
        await expect(page.get_by_text("Assignment changed.")).to_be_visible()
        await expect(page.locator("#assign-to")).to_have_value(str(ada.id))
        await page.locator("#note-text").fill("Refund approved by Joost")
        await page.get_by_role("button", name="Add note").click()
        await expect(page.get_by_text("Refund approved by Joost")).to_be_visible()
        await page.locator("[data-saved-reply]").select_option(label="Thanks")
        await expect(page.locator("#reply-text")).to_have_value("Hi Marieke de Vries, Ada here.")
        await page.set_viewport_size({"width": 360, "height": 740})
        await page.screenshot(path=tmp_path / "conversation-360.png", full_page=True)
        await page.locator("#reply-text").fill("")
        await page.keyboard.press("Escape")
        await page.keyboard.press("e")  # resolve
        await expect(
            page.get_by_text("Resolved; the conversation is back with the bot.")
        ).to_be_visible()
        assert await pool.fetchval(
            "SELECT inbox_status FROM conversations WHERE id = $1", marieke
        ) == "resolved"  # fmt: skip

        await page.goto(str(server.make_url("/admin/conversations")))
        await expect(rows).to_have_count(2)
        await expect(rows.nth(1).locator(".assignee")).to_have_text("Ada")
        await page.screenshot(path=tmp_path / "list-360.png", full_page=True)
        await page.set_viewport_size({"width": 1280, "height": 800})
        await page.goto(str(server.make_url(f"/admin/conversations/{marieke}")))
        await page.screenshot(path=tmp_path / "conversation-1280.png", full_page=True)
        print("screenshots in", tmp_path)
    finally:
        await server.close()
