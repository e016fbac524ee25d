"""An exploring answer says which page it is reading, in the visitor's language, on one line
inside the bubble at 360 and 1280 px; against the scripted chat endpoint."""

from __future__ import annotations

import re

import pytest
from aiohttp.test_utils import TestServer
from playwright.async_api import Browser, expect
from pytest_aiohttp import AiohttpServer

from tests.e2e.browser import ARTIFACTS, ask, last_answer, open_chat
from tests.e2e.test_widget import GATE, FakeChat, open_page, site_app
from tests.e2e.test_widget_layout import LAYOUT_PROBLEMS, VIEWPORTS

LONG_TITLE = "Verzending, levering en retourneren binnen Nederland, België en de rest van Europa"
ANSWER = "Pakketten naar België komen in 1–2 werkdagen aan [1]."
SOURCES = [{"id": 1, "url": "/nl/verzending.html", "title": "Verzending", "score": 0.8}]


@pytest.fixture
def fake() -> FakeChat:
    return FakeChat(
        scripts=[
            [
                ("status", {"step": "searching"}),
                GATE,
                ("status", {"step": "reading", "page": "Verzending"}),
                GATE,
                ("status", {"step": "reading", "page": LONG_TITLE}),
                GATE,
                ("status", {"step": "answering"}),
                ("token", {"text": ANSWER}),
                ("sources", {"sources": SOURCES}),
                ("done", {"conversation_id": 7, "turn_id": 1, "confidence": 0.8,
                          "low_confidence": False, "citations": [1], "answer": ANSWER,
                          "mode": "explore"}),
            ]
        ]
    )  # fmt: skip


@pytest.fixture
async def site(aiohttp_server: AiohttpServer, fake: FakeChat) -> TestServer:
    return await aiohttp_server(site_app(fake))


@pytest.mark.parametrize(("width", "height"), VIEWPORTS)
async def test_the_bubble_names_the_page_being_read(
    browser: Browser, site: TestServer, fake: FakeChat, width: int, height: int
) -> None:
    page = await open_page(browser, site, width=width, height=height)
    await open_chat(page)
    await ask(page, "Hoe lang duurt de levering naar België?")
    reply = last_answer(page)
    status = reply.locator(".status-text")
    await expect(status).to_have_text("Zoeken…")
    fake.release()
    await expect(status).to_have_text("Verzending lezen…")
    fake.release()
    # A title too long for the bubble is shortened, and ends in an ellipsis on one line,
    # inside the bubble.
    await expect(status).to_have_text(re.compile(r"^Verzending, levering .+… lezen…$"))
    title = status.locator(".status-page")
    assert await title.evaluate("el => el.scrollWidth > el.clientWidth")  # shortened
    # What it is doing stays in sight: the words after the title end inside the bubble.
    ends = await status.evaluate("el => el.getBoundingClientRect().right")
    box, bubble = await status.bounding_box(), await reply.bounding_box()
    assert box is not None
    assert bubble is not None
    assert box["height"] < 30
    assert ends <= bubble["x"] + bubble["width"] <= width
    assert await status.evaluate("el => el.scrollWidth <= el.clientWidth + 1")
    assert await page.evaluate(LAYOUT_PROBLEMS) == []
    ARTIFACTS.mkdir(exist_ok=True)
    await page.screenshot(path=ARTIFACTS / f"reading-{width}.png")
    fake.release()
    await expect(reply).to_have_attribute("data-state", "done")
    await expect(reply.locator(".status")).to_be_hidden()
    await expect(reply.locator(".sources a")).to_have_count(1)
    await page.close()
