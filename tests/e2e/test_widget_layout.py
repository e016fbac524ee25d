"""The open chat panel on the demo shop: long answers keep their boxes, above the shop's own overlays."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from playwright.async_api import Browser, Page, expect

from core.knowledge.ingest import Ingestor
from core.knowledge.sources import parse_source
from core.store import Agents
from core.store.knowledge import KnowledgeStore
from gateway.keys import DATABASE, EMBEDDER, HANDOFF
from tests.e2e.browser import ARTIFACTS, ask, last_answer, open_chat, widget
from tests.e2e.conftest import FakeLlm, Gateway, StartGateway

# A desktop and a small phone: the panel floats beside the page on one, fills the screen on
# the other.
VIEWPORTS = [pytest.param(1280, 800, id="1280px"), pytest.param(360, 640, id="360px")]
SHOP_PAGE = "/en/shipping.html"  # shows the shop's fixed cookie banner, as every shop page does

# Opening tag of a numbered source in the system prompt (see core.answer.prompt).
SOURCE_TAG = re.compile(r'<source id="(?P<id>\d+)" url="[^"]*"')

# A page whose address and title have no place to break, so the source list must wrap them.
LONG_PAGE = {
    "url": "/en/customer-service/warranty-claims-for-orders-placed-during-the-winter-sale-"
    "and-other-seasonal-promotions-2026.html",
    "title": "Warrantyclaimsforwintersaleordersandseasonalpromotionsnoordkaapoutdoor2026",
    "lang": "en",
    "text": "# Warranty claims for winter sale orders\nOrders placed during the winter sale keep "
    "the full two-year warranty. To claim warranty on a winter sale order, send the order "
    "number and a photo of the defect to the customer service team.",
}

QUESTIONS = [
    "How long does delivery to Belgium take and what does it cost?",
    "Can I return a jacket I have worn once, and how do I get a return label?",
    "Which payment methods can I use, and can I pay afterwards with Klarna?",
    "Which size of the Fjellsti Mid WP boot should I order if I normally wear 43?",
    # A long unbroken word in the visitor's own bubble, and a line break.
    "My order number is NK2026WINTERSALE000123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ.\n"
    "How do I claim warranty on a winter sale order?",
    "Is the Stormvang 3L jacket waterproof enough for a week of hiking in Norway?",
]

STAFF_REPLY = (
    "Hello, this is Anna from the Noordkaap service team!\n\n"
    "I have looked at your order and everything is in order. You can follow the parcel here: "
    "https://tracking.noordkaap.example/parcels/NK2026WINTERSALE000123456789ABCDEFGHIJKLMNOP"
    "?language=en&utm_source=chat\n\n"
    "Let me know if there is anything else I can do for you."
)

# A long address the answers link to; the help pages mention it, so it is no invented link
# (an answer with one would show no sources: see the README's "Answer quality gates").
LONG_LINK = (
    "https://noordkaap.example/en/customer-service/returns-and-exchanges/request-a-return-label"
    "?order=NK-2026-000123456789&channel=chat&utm_source=widget"
)


def long_answer(sources: list[int]) -> str:
    """Several paragraphs, two lists, a long link and a long word, citing every source."""
    cite = [f"[{n}]" for n in sources]
    first, second, third = (cite * 3)[:3]
    return (
        f"Good question! Here is everything you need to know, taken from our own pages {first}. "
        "We answer in some detail because the details differ per country, per product and per "
        "kind of order, and we would rather you know them before you order.\n\n"
        "What matters most:\n"
        f"- **Delivery and returns** follow the conditions on the shipping page {second}.\n"
        "- A longer point that wraps over several lines in a narrow panel, so that this one "
        f"list item grows taller than a single line of text does {third}.\n"
        "- Order codes such as `NK-RETURN-2026-000123456789` stay readable as well.\n\n"
        "1. Check your order confirmation.\n"
        "2. Follow the steps in your account.\n"
        "3. Contact us when something is unclear.\n\n"
        f"Everything in one place: {LONG_LINK}\n\n"
        "Some of our German pages use long words such as "
        "Rucksackregenschutzhüllenbefestigungsschlaufenverstellschnalle, which must wrap too.\n\n"
        f"I hope this helps; the sources below have the full details {' '.join(cite)}."
    )


def respond(body: dict[str, Any]) -> str:
    """The fake model: long answers to questions, and the visitor's words to a rewrite."""
    system = str(body["messages"][0]["content"])
    sources = [int(n) for n in SOURCE_TAG.findall(system)]
    if sources:
        return long_answer(sources[:4])
    return str(body["messages"][-1]["content"])  # a query rewrite or a summary: short


# Every box in the message log, checked in the log's own (scrolled) coordinates: each holds
# its content (no clipping, nothing drawn outside it, at least as tall as what it holds),
# stays inside the log's width, and no two boxes meet. Returns what is wrong, if anything.
LAYOUT_PROBLEMS = """() => {
    const log = document.querySelector('parley-chat').shadowRoot.querySelector('.log');
    const logBox = log.getBoundingClientRect();
    const inLog = (r) => ({
        top: r.top - logBox.top + log.scrollTop, bottom: r.bottom - logBox.top + log.scrollTop,
        left: r.left - logBox.left + log.scrollLeft, right: r.right - logBox.left + log.scrollLeft,
    });
    const shown = (el) => el.getClientRects().length > 0;
    const problems = [];
    const boxes = [...log.children].filter(shown);
    const rects = boxes.map((el) => inLog(el.getBoundingClientRect()));
    boxes.forEach((el, i) => {
        const name = `box ${i} (${el.className}, ${el.getAttribute('data-state') || 'shown'})`;
        const box = rects[i];
        if (el.scrollHeight > el.clientHeight + 1)
            problems.push(`${name} clips its content: scrollHeight ${el.scrollHeight} > clientHeight ${el.clientHeight}`);
        if (el.scrollWidth > el.clientWidth + 1)
            problems.push(`${name} clips its content: scrollWidth ${el.scrollWidth} > clientWidth ${el.clientWidth}`);
        if (box.left < -0.5 || box.right > log.clientWidth + 0.5)
            problems.push(`${name} sticks out of the log: ${box.left}..${box.right} of ${log.clientWidth}`);
        // What the box holds: every line of text and every element, except what is only
        // there for screen readers and what scrolls inside a box of its own (code blocks).
        const content = {top: Infinity, bottom: -Infinity, left: Infinity, right: -Infinity};
        const add = (r) => {
            if (r.width === 0 && r.height === 0) return;
            const c = inLog(r);
            content.top = Math.min(content.top, c.top);
            content.bottom = Math.max(content.bottom, c.bottom);
            content.left = Math.min(content.left, c.left);
            content.right = Math.max(content.right, c.right);
        };
        const walk = (node) => {
            for (const child of node.childNodes) {
                if (child.nodeType === Node.TEXT_NODE) {
                    const range = document.createRange();
                    range.selectNodeContents(child);
                    for (const r of range.getClientRects()) add(r);
                } else if (child.nodeType === Node.ELEMENT_NODE) {
                    if (child.classList.contains('sr-only') || !shown(child)) continue;
                    for (const r of child.getClientRects()) add(r);
                    if (getComputedStyle(child).overflowX === 'visible') walk(child);
                }
            }
        };
        walk(el);
        if (content.top === Infinity) return;
        if (box.bottom - box.top < content.bottom - content.top - 1)
            problems.push(`${name} is ${box.bottom - box.top}px tall for ${content.bottom - content.top}px of content`);
        if (content.top < box.top - 1 || content.bottom > box.bottom + 1 ||
                content.left < box.left - 1 || content.right > box.right + 1)
            problems.push(`${name} draws content outside its box: ${JSON.stringify(content)} vs ${JSON.stringify(box)}`);
    });
    for (let i = 0; i < rects.length; i++) {
        for (let j = i + 1; j < rects.length; j++) {
            const a = rects[i], b = rects[j];
            if (a.left < b.right - 0.5 && b.left < a.right - 0.5 &&
                    a.top < b.bottom - 0.5 && b.top < a.bottom - 0.5)
                problems.push(`boxes ${i} and ${j} overlap: ${JSON.stringify(a)} and ${JSON.stringify(b)}`);
        }
    }
    return problems;
}"""

# The layout checked on every animation frame while the last answer goes from its status
# indicator through streaming to its sources, until it is done or failed.
WATCH = """() => {
    const problems = (LAYOUT_PROBLEMS)();
    const seen = (window.__layoutProblems = window.__layoutProblems || []);
    for (const p of problems) if (seen.length < 20 && !seen.includes(p)) seen.push(p);
    const root = document.querySelector('parley-chat').shadowRoot;
    const msg = [...root.querySelectorAll('.msg.bot:not(.greeting)')].pop();
    const state = msg && msg.getAttribute('data-state');
    if (state !== 'done' && state !== 'error') return false;
    window.__layoutProblems = [];
    return {state, problems: seen};
}""".replace("LAYOUT_PROBLEMS", LAYOUT_PROBLEMS)


SHOW_FIFTH_QUESTION = """(log) => {
    const question = log.querySelectorAll('.msg.user')[4];
    const top = question.getBoundingClientRect().top - log.getBoundingClientRect().top;
    log.scrollTop += top - log.clientHeight / 3;
}"""


async def answer_with_layout_watched(page: Page, question: str) -> list[str]:
    """Asks `question`; what was wrong with the layout in any frame until the answer was done."""
    await page.evaluate("window.__layoutProblems = []")
    await ask(page, question)
    handle = await page.wait_for_function(WATCH, polling="raf", timeout=30_000)
    result: dict[str, Any] = await handle.json_value()
    assert result["state"] == "done", result
    problems: list[str] = result["problems"]
    return problems


async def unlimited_questions(database_url: str) -> None:
    """Lifts the per-session rate limit of agent `demo`, which would refuse a sixth question."""
    conn = await asyncpg.connect(database_url)
    try:
        limits = json.dumps({"rate_limits": {"session": [100, 100], "ip": [100, 100]}})
        await conn.execute(
            "UPDATE agents SET settings = settings || $1::jsonb WHERE slug = 'demo'", limits
        )
    finally:
        await conn.close()


def help_pages() -> list[dict[str, str]]:
    """Pages that answer each question, three apiece, so that every answer cites several."""
    pages = [LONG_PAGE]
    for n, question in enumerate(QUESTIONS, start=1):
        asked = question.splitlines()[-1]
        for part in ("Overview", "In detail", "Questions and answers"):
            pages.append(
                {
                    "url": f"/en/help/question-{n}-{part.lower().replace(' ', '-')}.html",
                    "title": f"{part}: {asked}",
                    "lang": "en",
                    "text": f"# {part}: {asked}\n{asked} This {part.lower()} page answers "
                    f"exactly that question for customers of Noordkaap Outdoor: {asked} "
                    f"Everything in one place: {LONG_LINK}",
                }
            )
    return pages


async def add_help_pages(gateway: Gateway, tmp_path: Path) -> None:
    pool = gateway.app[DATABASE].pool
    agent = await Agents(pool).get("demo")
    pages = help_pages()
    path = tmp_path / "help.jsonl"
    path.write_text("".join(json.dumps(page) + "\n" for page in pages), encoding="utf-8")
    report = await Ingestor(KnowledgeStore(pool), gateway.app[EMBEDDER]).ingest(
        agent, parse_source(str(path))
    )
    assert report.added == len(pages)


async def conversation_of(gateway: Gateway, page: Page) -> int:
    session = await page.evaluate("window.ParleyWidget.sessionId")
    found: int = await gateway.app[DATABASE].pool.fetchval(
        "SELECT id FROM conversations WHERE channel = 'web' AND conversation_key = $1", session
    )
    return found


@pytest.mark.parametrize(("width", "height"), VIEWPORTS)
async def test_long_answers_never_shrink_clip_or_overlap(
    browser: Browser,
    start_gateway: StartGateway,
    llm: FakeLlm,
    demo_copy: str,
    tmp_path: Path,
    width: int,
    height: int,
) -> None:
    await unlimited_questions(demo_copy)
    llm.fake.responder = respond
    llm.fake.first_token_delay = 0.2  # the status indicator shows for a few frames
    gateway = await start_gateway(with_llm=True)
    await add_help_pages(gateway, tmp_path)
    page = await browser.new_page(viewport={"width": width, "height": height})
    await page.goto(gateway.url + SHOP_PAGE)
    await open_chat(page, "Open chat")
    chat = widget(page)
    log = chat.get_by_role("log")

    problems: dict[str, list[str]] = {}
    for question in QUESTIONS:
        problems[question] = await answer_with_layout_watched(page, question)
        reply = last_answer(page)
        await expect(reply).to_have_attribute("data-mode", "llm")
        await expect(reply.locator(".answer li")).to_have_count(6)
        assert await reply.locator(".sources a").count() >= 3
    await expect(chat.locator(".msg.user")).to_have_count(len(QUESTIONS))
    await expect(chat.locator(".msg.bot:not(.greeting)")).to_have_count(len(QUESTIONS))
    await expect(chat.locator(".sources a", has_text=str(LONG_PAGE["title"]))).not_to_have_count(0)
    # The answers really did not fit: the log scrolls, several screens long.
    assert await log.evaluate("el => el.scrollHeight > 3 * el.clientHeight")

    # Someone from the team takes over and writes back, then hands the chat back.
    handoff = gateway.app[HANDOFF]
    conversation = await conversation_of(gateway, page)
    await handoff.take_over(conversation, "anna")
    await expect(chat.locator(".note")).to_have_count(1)
    await handoff.reply(conversation, STAFF_REPLY, "anna")
    await expect(chat.locator(".msg.staff")).to_contain_text("Let me know if there is anything")
    await handoff.hand_back(conversation)
    await expect(chat.locator(".note")).to_have_count(2)
    problems["at the end"] = await page.evaluate(LAYOUT_PROBLEMS)

    # Pictures first, so that a failure below leaves one of what went wrong.
    ARTIFACTS.mkdir(exist_ok=True)
    await page.screenshot(path=ARTIFACTS / f"widget-layout-{width}.png")
    # Up the log, where an answer's sources meet the question with the long word.
    await log.evaluate(SHOW_FIFTH_QUESTION)
    problems["scrolled up"] = await page.evaluate(LAYOUT_PROBLEMS)
    await page.screenshot(path=ARTIFACTS / f"widget-layout-{width}-middle.png")
    # The source list with the address and title that have no place to break.
    await chat.locator(
        ".sources a", has_text=str(LONG_PAGE["title"])
    ).first.scroll_into_view_if_needed()
    problems["at the long source"] = await page.evaluate(LAYOUT_PROBLEMS)
    await page.screenshot(path=ARTIFACTS / f"widget-layout-{width}-sources.png")
    found = [f"{when!r}: {problem}" for when, listed in problems.items() for problem in listed]
    assert found == [], "\n".join(found)
    await page.close()


# Points spread over the open panel, each with what the page finds on top there.
ON_TOP = """() => {
    const host = document.querySelector('parley-chat');
    const panel = host.shadowRoot.querySelector('.panel').getBoundingClientRect();
    const banner = document.querySelector('.cookie-banner').getBoundingClientRect();
    const points = [];
    for (let i = 0; i <= 6; i++) {
        for (let j = 0; j <= 8; j++) {
            // Inset past the rounded corners, which are not part of the panel.
            const x = panel.left + 20 + (panel.width - 40) * i / 6;
            const y = panel.top + 20 + (panel.height - 40) * j / 8;
            const found = document.elementFromPoint(x, y);
            const under = x >= banner.left && x < banner.right && y >= banner.top && y < banner.bottom;
            points.push({x, y, under, host: found === host, found: found && found.outerHTML.slice(0, 60)});
        }
    }
    return {panel: panel.toJSON(), viewport: [innerWidth, innerHeight], points};
}"""


@pytest.mark.parametrize(("width", "height"), VIEWPORTS)
async def test_open_panel_sits_above_the_shops_cookie_banner(
    browser: Browser, start_gateway: StartGateway, width: int, height: int
) -> None:
    gateway = await start_gateway(with_llm=False)
    page = await browser.new_page(viewport={"width": width, "height": height})
    await page.goto(gateway.url + SHOP_PAGE)
    banner = page.get_by_role("dialog", name="This website uses cookies")
    await expect(banner).to_be_visible()
    await open_chat(page, "Open chat")
    await expect(widget(page).get_by_role("textbox")).to_be_focused()

    seen = await page.evaluate(ON_TOP)
    panel = seen["panel"]
    assert panel["left"] >= 0, panel
    assert panel["top"] >= 0, panel
    assert panel["right"] <= width, panel
    assert panel["bottom"] <= height, panel
    assert seen["viewport"] == [width, height]
    # The banner does lie across the panel here: the check below is about those points.
    assert any(p["under"] for p in seen["points"]), seen
    covered = [p for p in seen["points"] if not p["host"]]
    assert covered == [], covered
    # Typing in the part of the panel the banner lies across still reaches the widget.
    await widget(page).get_by_role("textbox").click()
    await expect(widget(page).get_by_role("textbox")).to_be_focused()
    await page.close()
