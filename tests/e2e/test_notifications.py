"""Being told, in the browser: a customer asks for a person in the widget, and the staff's
open console shows the count in its tab title and header, and a browser notification."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiohttp.test_utils import TestServer
from playwright.async_api import Browser, expect

from core.knowledge.ingest import Ingestor
from core.knowledge.sources import parse_source
from core.retrieval.embedders import UseEmbedder
from core.store import Agents, Database
from core.store.knowledge import KnowledgeStore
from core.store.vector_index import EmbedderIdentity
from gateway.app import create_app
from gateway.demo import DEMO_SITE, DemoSite
from tests.conftest import MakeSettings
from tests.e2e.browser import ask, chromium, open_chat
from tests.support.console import TOKEN

PAGE = "/nl/retourneren.html"
PAGES = [
    {"url": "/nl/retourneren", "title": "Retourneren", "lang": "nl",
     "text": "# Retourneren\nJe kunt elk artikel binnen 30 dagen retourneren."},
]  # fmt: skip
# Records each `new Notification(...)` the page makes, so the test can see what was shown.
RECORD_NOTIFICATIONS = """
window.__shown = [];
const Real = window.Notification;
class Recorded extends Real {
  constructor(title, options) { super(title, options); window.__shown.push({title, options}); }
}
window.Notification = Recorded;
"""


@pytest.fixture
async def browser() -> AsyncIterator[Browser]:
    async with chromium() as launched:
        yield launched


@pytest.fixture
async def servers(
    make_settings: MakeSettings, database: Database, use_embedder: UseEmbedder, tmp_path: Path
) -> AsyncIterator[tuple[str, str]]:
    agent = await Agents(database.pool).create("shop", embedder=EmbedderIdentity.of(use_embedder))
    path = tmp_path / "pages.jsonl"
    path.write_text("\n".join(json.dumps(p) for p in PAGES), encoding="utf-8")
    await Ingestor(KnowledgeStore(database.pool), use_embedder).ingest(
        agent, parse_source(str(path))
    )
    settings = make_settings(admin_token=TOKEN)
    visitors = TestServer(create_app(settings, DemoSite(DEMO_SITE, "shop", agent.widget_key)))
    staff = TestServer(create_app(settings))
    await visitors.start_server()
    await staff.start_server()
    try:
        yield str(visitors.make_url("")).rstrip("/"), str(staff.make_url("")).rstrip("/")
    finally:
        await visitors.close()
        await staff.close()


async def test_staff_are_told_when_a_customer_asks_for_a_person(
    servers: tuple[str, str], browser: Browser, tmp_path: Path
) -> None:
    shop, console = servers
    context = await browser.new_context(viewport={"width": 1280, "height": 800})
    await context.grant_permissions(["notifications"], origin=console)
    await context.add_init_script(RECORD_NOTIFICATIONS)
    staff = await context.new_page()
    await staff.goto(console + "/admin/sign-in")
    await staff.get_by_label("Admin token", exact=True).fill(TOKEN)
    await staff.get_by_role("button", name="Sign in with the token").click()
    await staff.goto(console + "/admin/conversations")
    await expect(staff).to_have_title("Conversations · Parley")
    badge = staff.locator("header [data-waiting]")
    await expect(badge).to_be_hidden()
    # Permission was granted already, so the console does not offer to ask for it.
    await expect(staff.get_by_role("button", name="Turn on notifications")).to_be_hidden()

    customer = await context.new_page()
    await customer.goto(shop + PAGE)
    await open_chat(customer)
    await ask(customer, "Ik wil een medewerker spreken")

    await expect(staff).to_have_title("(1) Conversations · Parley")
    await expect(badge).to_have_text("1 waiting")
    shown = await staff.wait_for_function("window.__shown.length > 0 && window.__shown")
    [notification] = await shown.json_value()
    assert notification["title"] == "A customer asked for a person"
    assert notification["options"]["body"] == "shop · web"
    await staff.locator("header").screenshot(path=tmp_path / "header-1280.png")

    await staff.set_viewport_size({"width": 360, "height": 740})
    await expect(badge).to_be_visible()
    await staff.locator("header").screenshot(path=tmp_path / "header-360.png")
    await context.close()
