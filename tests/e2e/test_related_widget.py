"""Related reading in the chat bubble: small link cards under an answer, in a long
conversation on a phone and on a desktop, against the scripted chat endpoint."""

from __future__ import annotations

import re
from typing import Any

import pytest
from aiohttp.test_utils import TestServer
from playwright.async_api import Browser, expect
from pytest_aiohttp import AiohttpServer

from tests.e2e.browser import ARTIFACTS, ask, last_answer, open_chat, widget
from tests.e2e.test_widget import FakeChat, Step, open_page, site_app
from tests.e2e.test_widget_layout import LAYOUT_PROBLEMS, VIEWPORTS, long_answer

SOURCES = [
    {"id": 1, "url": "/nl/verzending.html", "title": "Verzending en levering", "score": 0.8},
    {"id": 2, "url": "/nl/retourneren.html", "title": "Retourneren", "score": 0.7},
]
LONG_URL = (
    "https://shop.example/nl/klantenservice/garantie-en-reparatie-van-jassen-en-schoenen-"
    "die-tijdens-de-winteruitverkoop-zijn-gekocht.html"
)
RELATED = [
    {"title": "Betaalmethoden", "url": "/nl/betalen.html"},
    {"title": "Garantieenreparatievanjassenenschoenenuitdewinteruitverkoop2026", "url": LONG_URL},
    {"title": "Maattabel wandelschoenen", "url": "https://www.shop.example/nl/maten/"},
    {"title": "Kwaadaardig", "url": "javascript:window.pwned=1"},
]
QUESTIONS = [
    "Hoe lang duurt de levering naar België en wat kost het?",
    "Kan ik een jas retourneren die ik één keer heb gedragen?",
    "Welke betaalmethoden kan ik gebruiken?",
    "Welke maat wandelschoen moet ik nemen als ik normaal 43 draag?",
]


def script(turn: int) -> list[Step]:
    """An answer that cites both sources, then three pages to read on (and one refused)."""
    text = long_answer([1, 2])
    return [
        ("status", {"step": "searching"}),
        ("status", {"step": "answering"}),
        *[("token", {"text": word}) for word in re.findall(r"\S+\s*", text)],
        ("sources", {"sources": SOURCES}),
        ("related", {"related": RELATED}),
        ("done", {"conversation_id": 7, "turn_id": turn, "confidence": 0.8,
                  "low_confidence": False, "citations": [1, 2], "answer": text, "mode": "llm"}),
    ]  # fmt: skip


@pytest.fixture
def fake() -> FakeChat:
    return FakeChat(scripts=[script(n) for n in range(1, len(QUESTIONS) + 1)])


@pytest.fixture
async def site(aiohttp_server: AiohttpServer, fake: FakeChat) -> TestServer:
    return await aiohttp_server(site_app(fake))


# Each card of the last answer: inside the answer's bubble, its text inside the card.
CARDS = """(msg) => {
    const bubble = msg.getBoundingClientRect();
    return [...msg.querySelectorAll('.related-card')].map((card) => {
        const box = card.getBoundingClientRect();
        return {
            inside: box.left >= bubble.left && box.right <= bubble.right + 0.5,
            fits: card.scrollWidth <= card.clientWidth + 1,
            height: box.height,
            where: card.querySelector('.card-where').textContent,
        };
    });
}"""


@pytest.mark.parametrize(("width", "height"), VIEWPORTS)
async def test_related_pages_show_as_link_cards_under_the_answer(
    browser: Browser, site: TestServer, fake: FakeChat, width: int, height: int
) -> None:
    page = await open_page(browser, site, width=width, height=height)
    await open_chat(page)
    for question in QUESTIONS:
        await ask(page, question)
        await expect(last_answer(page)).to_have_attribute("data-state", "done")
    reply = last_answer(page)
    related = reply.locator(".related")
    await expect(related.get_by_text("Lees ook", exact=True)).to_be_visible()
    cards = related.get_by_role("link")
    await expect(cards).to_have_count(3)  # the javascript: address is dropped
    first = related.get_by_role("link", name=re.compile("^Betaalmethoden"))
    await expect(first).to_have_attribute("href", "/nl/betalen.html")
    await expect(first).to_have_attribute("target", "_blank")
    await expect(first).to_have_attribute("rel", "noopener")
    host = re.sub(r"^http://", "", str(site.make_url("")).rstrip("/"))
    await expect(cards.locator(".card-where")).to_have_text(
        [f"{host}/nl/betalen.html", LONG_URL.removeprefix("https://"), "shop.example/nl/maten"]
    )
    # Under the sources, above the thumbs: the answer's own parts come first.
    order = await reply.evaluate(
        "(msg) => [...msg.children].filter((el) => el.getClientRects().length)"
        ".map((el) => el.className)"
    )
    assert order[-3:] == ["sources", "related", "feedback"], order
    for card in await reply.evaluate(CARDS):
        assert card["inside"], card
        assert card["fits"], card
        assert card["height"] < 80, card  # a title of two lines at most, and its address
    await cards.last.focus()
    await expect(cards.last).to_be_focused()  # reached by the keyboard, like any link
    await cards.last.blur()
    problems = await page.evaluate(LAYOUT_PROBLEMS)
    assert problems == [], problems

    ARTIFACTS.mkdir(exist_ok=True)
    await page.screenshot(path=ARTIFACTS / f"related-{width}.png")
    # Up the log, where one answer's cards meet the next question.
    await reply.evaluate("(msg) => msg.previousElementSibling.scrollIntoView({block: 'center'})")
    assert await page.evaluate(LAYOUT_PROBLEMS) == []
    await page.screenshot(path=ARTIFACTS / f"related-{width}-middle.png")

    # The cards come back with the conversation on the next page.
    await page.reload()
    await open_chat(page)
    await expect(widget(page).locator(".related-card")).to_have_count(3 * len(QUESTIONS))
    assert await page.evaluate("typeof window.pwned") == "undefined"
    await page.close()


async def test_an_answer_without_related_pages_shows_no_cards(
    browser: Browser, site: TestServer, fake: FakeChat
) -> None:
    plain: list[Any] = [step for step in script(1) if step[0] != "related"]
    fake.scripts = [plain]
    page = await open_page(browser, site)
    await open_chat(page)
    await ask(page, QUESTIONS[0])
    reply = last_answer(page)
    await expect(reply).to_have_attribute("data-state", "done")
    await expect(reply.locator(".sources a")).to_have_count(2)
    await expect(reply.locator(".related")).to_be_hidden()
    await page.close()
