"""The closed-window reply box in headless Chromium: staff pick an approved template, fill in its
values while the preview follows, and send it; on a phone and on a wide screen."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from aiohttp.test_utils import TestServer
from playwright.async_api import Browser, Page, expect

from core.keyring import Keyring
from core.retrieval.embedders import UseEmbedder
from core.settings import Settings
from core.store import Agents, Database
from gateway.app import create_app
from tests.conftest import MakeSettings
from tests.e2e.browser import chromium
from tests.support.console import TOKEN, WHATSAPP, seed

ORDER_SENT = "Hi Sam, your order #1042 has shipped.\nReply here with any questions."
TEMPLATES = [
    {"name": "still_there", "provider_id": "HX" + "b2" * 16, "language": "en",
     "text": "Hello! Do you still need help with your question?"},
    {"name": "order_update", "provider_id": "HX" + "a1" * 16, "language": "en",
     "text": "Hi {{1}}, your order {{2}} has shipped.\nReply here with any questions."},
]  # fmt: skip


@dataclass
class Console:
    server: TestServer
    pool: asyncpg.Pool
    conversation: int

    def url(self, path: str) -> str:
        return str(self.server.make_url(path))


@pytest.fixture
async def browser() -> AsyncIterator[Browser]:
    async with chromium() as launched:
        yield launched


@pytest.fixture
async def console(
    make_settings: MakeSettings,
    settings: Settings,
    database: Database,
    cache: Any,
    use_embedder: UseEmbedder,
    tmp_path: Path,
) -> AsyncIterator[Console]:
    """The seeded shop, with approved Twilio templates, whose WhatsApp customer last wrote
    26 hours ago."""
    data = await seed(settings, database, cache, use_embedder, tmp_path)
    agents = Agents(database.pool, keyring=Keyring.from_settings(settings))
    stored = await agents.get("shop")
    twilio = {**stored.settings["twilio"], "templates": TEMPLATES}
    await agents.update("shop", settings={**stored.settings, "twilio": twilio})
    conversation = data.conversations[WHATSAPP]
    for table, key in (("messages", "conversation_id"), ("conversations", "id")):
        await database.pool.execute(
            f"UPDATE {table} SET created_at = created_at - interval '26 hours' WHERE {key} = $1",
            conversation,
        )
    await database.pool.execute(
        "UPDATE conversations SET last_message_at = last_message_at - interval '26 hours' "
        "WHERE id = $1",
        conversation,
    )
    server = TestServer(create_app(make_settings(admin_token=TOKEN)))
    await server.start_server()
    yield Console(server, database.pool, conversation)
    await server.close()


async def _signed_in(browser: Browser, console: Console, width: int) -> Page:
    page = await browser.new_page(viewport={"width": width, "height": 900})
    await page.goto(console.url("/admin"))
    await page.get_by_label("Admin token", exact=True).fill(TOKEN)
    await page.get_by_role("button", name="Sign in with the token", exact=True).click()
    await expect(page.get_by_role("heading", name="Conversations", exact=True)).to_be_visible()
    return page


@pytest.mark.parametrize("width", [360, 1280])
async def test_a_closed_window_offers_templates_with_a_preview_and_sends_one(
    browser: Browser, console: Console, width: int, tmp_path: Path
) -> None:
    page = await _signed_in(browser, console, width)
    await page.goto(console.url(f"/admin/conversations/{console.conversation}"))
    closed = page.locator(".window-closed")
    await expect(closed).to_contain_text(
        "The customer last wrote 26 hours ago. WhatsApp (Twilio) only delivers approved "
        "templates now."
    )
    await expect(page.get_by_label("Reply to the customer")).to_have_count(0)

    picker = page.get_by_label("Template", exact=True)
    await expect(picker).to_have_value("still_there")
    first = page.locator('form[data-template="still_there"]')
    chosen = page.locator('form[data-template="order_update"]')
    await expect(first).to_be_visible()
    await expect(chosen).to_be_hidden()  # one template at a time
    await picker.select_option("order_update")
    await expect(chosen).to_be_visible()
    await expect(first).to_be_hidden()

    preview = chosen.locator("[data-preview]")
    await expect(preview).to_have_text(
        "Hi {{1}}, your order {{2}} has shipped.\nReply here with any questions."
    )
    await chosen.get_by_label("Value for {{1}}").fill("Sam")
    await expect(preview).to_have_text(
        "Hi Sam, your order {{2}} has shipped.\nReply here with any questions."
    )
    await chosen.get_by_label("Value for {{2}}").fill("#1042")
    await expect(preview).to_have_text(ORDER_SENT)

    assert await page.evaluate("document.documentElement.scrollWidth") <= width
    await _no_overlaps(page, ".handoff")
    await chosen.scroll_into_view_if_needed()
    await page.screenshot(path=tmp_path / f"template-picker-{width}.png", full_page=True)

    await chosen.get_by_role("button", name="Send template").click()
    await expect(page.get_by_role("status")).to_have_text("The template is on its way.")
    sent = page.locator(".msg.staff").last
    await expect(sent.locator(".text")).to_have_text(ORDER_SENT)
    await expect(sent.locator(".delivery")).to_have_text("queued")
    await page.screenshot(path=tmp_path / f"template-sent-{width}.png", full_page=True)

    stored = await console.pool.fetchrow(
        """SELECT m.role, m.text, o.body, o.template FROM messages m
             JOIN outbox o ON o.message_id = m.id
            WHERE m.conversation_id = $1 AND m.role = 'staff'""",
        console.conversation,
    )
    assert dict(stored) == {
        "role": "staff",
        "text": ORDER_SENT,
        "body": ORDER_SENT,
        "template": {
            "name": "order_update",
            "provider_id": TEMPLATES[1]["provider_id"],
            "language": "en",
            "values": ["Sam", "#1042"],
        },
    }
    await page.close()


async def _no_overlaps(page: Page, within: str) -> None:
    """No two visible labels, inputs, buttons or texts of ``within`` overlap on screen."""
    overlaps = await page.evaluate(
        """(selector) => {
          const parts = [...document.querySelector(selector).querySelectorAll(
              "label, input, select, button, p, h3, [data-preview]")]
            .filter((el) => el.offsetParent !== null && !el.closest("[hidden]"))
            .filter((el) => !(el.tagName === "P" && el.querySelector("input, button")));
          const boxes = parts.map((el) => [el, el.getBoundingClientRect()]);
          const found = [];
          for (let i = 0; i < boxes.length; i++) {
            for (let j = i + 1; j < boxes.length; j++) {
              const [a, r] = boxes[i], [b, s] = boxes[j];
              if (a.contains(b) || b.contains(a)) continue;
              const x = Math.min(r.right, s.right) - Math.max(r.left, s.left);
              const y = Math.min(r.bottom, s.bottom) - Math.max(r.top, s.top);
              if (x > 1 && y > 1) found.push(a.outerHTML.slice(0, 80) + " / " + b.outerHTML.slice(0, 80));
            }
          }
          return found;
        }""",
        within,
    )
    assert overlaps == [], overlaps


@pytest.mark.parametrize("width", [360, 1280])
async def test_an_admin_adds_a_template_on_the_settings_page(
    browser: Browser, console: Console, width: int, tmp_path: Path
) -> None:
    page = await _signed_in(browser, console, width)
    await page.goto(console.url("/admin/agents/shop/settings#templates"))
    twilio = page.locator('fieldset.channel-templates[data-channel="twilio"]')
    await expect(twilio.locator("fieldset.template-row")).to_have_count(3)  # two, and a new one
    new = twilio.locator("fieldset.template-row").last
    await expect(new.locator("legend")).to_have_text("New template")
    await new.get_by_label("Name").fill("delivery_delay")
    await new.get_by_label("Content SID").fill("HX" + "d4" * 16)
    await new.get_by_label("Language").fill("en")
    await new.get_by_label("Text, exactly as approved").fill("Hi {{1}}, your parcel is delayed.")
    assert await page.evaluate("document.documentElement.scrollWidth") <= width
    await _no_overlaps(page, "#templates")
    # The settings page is long: the templates section alone.
    await page.locator("#templates").screenshot(path=tmp_path / f"template-settings-{width}.png")

    await page.get_by_role("button", name="Save templates").click()
    await expect(page.get_by_role("status")).to_have_text("Templates saved.")
    saved = twilio.locator("fieldset.template-row").nth(2)
    await expect(saved.locator("legend")).to_have_text("Template 3: delivery_delay")
    await page.goto(console.url(f"/admin/conversations/{console.conversation}"))
    await page.get_by_label("Template", exact=True).select_option("delivery_delay")
    chosen = page.locator('form[data-template="delivery_delay"]')
    await chosen.get_by_label("Value for {{1}}").fill("Sam")
    await expect(chosen.locator("[data-preview]")).to_have_text("Hi Sam, your parcel is delayed.")
    await page.close()
