"""The reports page in headless Chromium at phone and desktop widths, over a seeded history."""

from __future__ import annotations

from pathlib import Path

from aiohttp.test_utils import TestServer
from playwright.async_api import Browser, expect

from channels.registry import secret_fields
from core.keyring import Keyring
from core.retrieval.embedders import UseEmbedder
from core.settings import Settings
from core.store import Agents, Database
from core.store.vector_index import EmbedderIdentity
from gateway.app import create_app
from tests.conftest import MakeSettings
from tests.integration.test_reports import PERIOD, seed_history
from tests.support.console import TOKEN


async def test_reports_page_at_360_and_1280(
    browser: Browser,
    make_settings: MakeSettings,
    settings: Settings,
    database: Database,
    use_embedder: UseEmbedder,
    tmp_path: Path,
) -> None:
    agents = Agents(
        database.pool, keyring=Keyring.from_settings(settings), secret_fields=secret_fields()
    )
    shop = await agents.create(
        "shop",
        embedder=EmbedderIdentity.of(use_embedder),
        name="Noordkaap Shop",
        timezone="Europe/Amsterdam",
    )
    await seed_history(database.pool, shop.id)
    server = TestServer(create_app(make_settings(admin_token=TOKEN)))
    await server.start_server()
    try:
        page = await browser.new_page(viewport={"width": 1280, "height": 900})
        await page.goto(str(server.make_url("/admin")))
        await page.get_by_label("Admin token", exact=True).fill(TOKEN)
        await page.get_by_role("button", name="Sign in with the token", exact=True).click()
        await page.get_by_role("link", name="Reports", exact=True).click()
        await expect(page.get_by_role("heading", name="Reports", exact=True)).to_be_visible()
        await expect(page.locator(".report-period")).to_contain_text("Europe/Amsterdam")

        await page.goto(str(server.make_url(f"/admin/reports?{PERIOD}")))
        chart = page.locator("#chart-conversations").get_by_role("img")
        await expect(chart).to_be_visible()
        await expect(page.locator("#chart-conversations rect[fill]")).to_have_count(4)
        numbers = page.locator("#chart-staff_first_response_s_median details")
        await numbers.locator("summary").click()
        await expect(numbers.get_by_role("row", name="2026-03-03")).to_contain_text("10.0 min")
        await page.screenshot(path=tmp_path / "reports-1280.png", full_page=True)

        await page.set_viewport_size({"width": 360, "height": 800})
        await expect(chart).to_be_visible()
        box = await chart.bounding_box()
        assert box is not None
        assert box["x"] >= 0
        assert box["x"] + box["width"] <= 360
        width = await page.evaluate("document.documentElement.scrollWidth")
        assert width <= 360, "the page scrolls sideways at 360 px"
        await page.screenshot(path=tmp_path / "reports-360.png", full_page=True)
        await chart.screenshot(path=tmp_path / "reports-360-chart.png")
    finally:
        await server.close()
