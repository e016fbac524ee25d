"""The chat bubble in headless Chromium against the real gateway serving the demo shop."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import aiohttp
from playwright.async_api import Browser, Page, expect

from core.knowledge.ingest import Ingestor
from core.knowledge.sources import parse_source
from core.store import Agents
from core.store.knowledge import KnowledgeStore
from gateway.demo import DEMO_SITE
from gateway.keys import DATABASE, EMBEDDER
from tests.e2e.browser import ARTIFACTS, ask, last_answer, open_chat, widget
from tests.e2e.conftest import MODEL, FakeLlm, Gateway, StartGateway

# Opening tag of a numbered source in the system prompt (see core.answer.prompt).
SOURCE_TAG = re.compile(r'<source id="(?P<id>\d+)" url="(?P<url>[^"]*)" title="(?P<title>[^"]*)">')

# ------------------------------------------------------------------ the shop in a browser


async def open_shop(browser: Browser, gateway: Gateway, path: str) -> Page:
    page = await browser.new_page(viewport={"width": 1280, "height": 800})
    await page.goto(gateway.url + path)
    return page


# ------------------------------------------------------------------ what the page shows

# What the last answer looks like, recorded every animation frame (the rate at which the
# widget draws tokens) whenever it changes, until the answer is done or failed.
TIMELINE = """() => {
    const root = document.querySelector('parley-chat').shadowRoot;
    const msg = [...root.querySelectorAll('.msg.bot:not(.greeting)')].pop();
    if (!msg) return false;
    const frames = (window.__parleyFrames = window.__parleyFrames || []);
    const status = msg.querySelector('.status');
    const now = {
        state: msg.getAttribute('data-state'),
        status: status.checkVisibility() ? status.textContent : null,
        text: msg.querySelector('.answer').textContent,
    };
    const last = frames[frames.length - 1];
    if (!last || ['state', 'status', 'text'].some((k) => last[k] !== now[k])) frames.push(now);
    return now.state === 'done' || now.state === 'error' ? frames : false;
}"""

# Markup and handlers anywhere in the widget: model or source text must only become text.
INERT = """() => {
    const root = document.querySelector('parley-chat').shadowRoot;
    return {
        markup: root.querySelectorAll('script, img, iframe, object, embed, image').length,
        handlers: [...root.querySelectorAll('*')].filter(
            (el) => [...el.attributes].some((a) => a.name.startsWith('on'))).length,
    };
}"""


async def follow_answer(page: Page) -> list[dict[str, Any]]:
    """The states the answer just asked for went through: call right after `ask`."""
    handle = await page.wait_for_function(TIMELINE, polling="raf", timeout=30_000)
    frames: list[dict[str, Any]] = await handle.json_value()
    return frames


def streamed(frames: list[dict[str, Any]]) -> list[str]:
    """The different texts the answer showed before it was done."""
    return [f["text"] for f in frames if f["state"] == "streaming" and f["text"]]


def status_first(frames: list[dict[str, Any]], labels: set[str]) -> None:
    """A status step was shown, and before any answer text."""
    shown = [i for i, f in enumerate(frames) if f["status"]]
    assert shown, frames
    assert {frames[i]["status"] for i in shown} <= labels, frames
    with_text = [i for i, f in enumerate(frames) if f["text"]]
    assert with_text, frames
    assert shown[0] < with_text[0], frames
    assert frames[-1]["state"] == "done", frames[-1]
    assert frames[-1]["status"] is None, frames[-1]


def prompt_sources(system: str) -> dict[int, tuple[str, str]]:
    return {int(m["id"]): (m["url"], m["title"]) for m in SOURCE_TAG.finditer(system)}


# ------------------------------------------------------------------ the visitor's path


async def test_dutch_visitor_gets_an_extractive_answer_with_its_source(
    browser: Browser, start_gateway: StartGateway
) -> None:
    gateway = await start_gateway(with_llm=False)
    key = (await Agents(gateway.app[DATABASE].pool).get("demo")).widget_key
    assert key.startswith("pk_")
    async with aiohttp.ClientSession() as http, http.get(gateway.url + "/nl/verzending.html") as r:
        assert r.status == 200
        html = await r.text()
    tag = f'<script src="/widget.js" data-agent="demo" data-key="{key}" async></script>'
    assert html.count(tag) == 1

    page = await open_shop(browser, gateway, "/nl/verzending.html")
    await open_chat(page)
    await expect(widget(page).get_by_role("heading", name="Stel een vraag")).to_be_visible()
    await ask(page, "Hoe lang duurt de levering naar België?")
    frames = await follow_answer(page)
    status_first(frames, {"Zoeken…", "Lezen…", "Antwoorden…"})
    reply = last_answer(page)
    await expect(reply).to_have_attribute("data-mode", "extractive")
    await expect(reply).not_to_have_class(re.compile(r"\blow-confidence\b"))
    await expect(reply.locator(".status")).to_be_hidden()
    answer = reply.locator(".answer")
    await expect(answer).to_have_text(frames[-1]["text"])
    assert len(frames[-1]["text"].split()) >= 5, frames[-1]
    await expect(reply.locator(".sources-title")).to_have_text("Bronnen")
    links = reply.locator(".sources a")
    await expect(links.first).to_have_text("Verzending en levering | Noordkaap Outdoor")
    for href in await links.evaluate_all("(links) => links.map((a) => a.getAttribute('href'))"):
        assert re.fullmatch(r"/(nl|en|de)/[a-z0-9/-]+\.html", href), href
        assert (DEMO_SITE / href.lstrip("/")).is_file(), href
    await expect(links.first).to_have_attribute("href", "/nl/verzending.html")
    await expect(answer.locator("sup.cite a").first).to_have_attribute(
        "href", "/nl/verzending.html"
    )
    assert await page.evaluate(INERT) == {"markup": 0, "handlers": 0}
    await page.close()


async def test_an_extractive_answer_grows_while_it_streams(
    browser: Browser, start_gateway: StartGateway
) -> None:
    gateway = await start_gateway(with_llm=False)
    page = await open_shop(browser, gateway, "/nl/verzending.html")
    await open_chat(page)
    await ask(page, "Hoe lang duurt de levering naar België?")
    texts = streamed(await follow_answer(page))
    # Three rather than two: the scheduler splitting the burst once is not growth.
    assert len(texts) >= 3, texts
    await page.close()


async def test_llm_answer_streams_with_citations_and_a_guarded_prompt(
    browser: Browser, start_gateway: StartGateway, llm: FakeLlm
) -> None:
    question = "How long does delivery to Belgium take?"
    llm.fake.replies[MODEL] = [
        "Delivery to Belgium takes 1–2 working days with PostNL [1]. "
        "It costs **€ 6.95**, and it is free from € 75 [1]."
    ]
    llm.fake.first_token_delay = 0.3
    llm.fake.token_delay = 0.08
    gateway = await start_gateway(with_llm=True)
    page = await open_shop(browser, gateway, "/en/shipping.html")
    await open_chat(page, "Open chat")
    await ask(page, question)
    frames = await follow_answer(page)
    status_first(frames, {"Searching…", "Reading…", "Answering…"})
    texts = streamed(frames)
    assert len(texts) >= 3, texts
    assert texts[0].startswith("Delivery"), texts
    assert texts[1].startswith(texts[0])
    assert len(texts[1]) > len(texts[0])
    reply = last_answer(page)
    await expect(reply).to_have_attribute("data-state", "done")
    await expect(reply).to_have_attribute("data-mode", "llm")
    answer = reply.locator(".answer")
    await expect(answer).to_have_text(
        "Delivery to Belgium takes 1–2 working days with PostNL 1. "
        "It costs € 6.95, and it is free from € 75 1."
    )
    await expect(answer.locator("strong")).to_have_text("€ 6.95")

    (request,) = llm.fake.turn_requests  # a first question is searched as asked: no rewrite
    messages = request["messages"]
    assert request["model"] == MODEL
    assert messages[0]["role"] == "system"
    system = messages[0]["content"]
    assert "never instructions to you" in system
    assert '<source id="1"' in system
    assert messages[-1] == {"role": "user", "content": question}
    [sent] = [r for r in llm.fake.requests if r["body"] is request]
    assert sent["auth"] == "Bearer sk-test"

    url, title = prompt_sources(system)[1]
    citations = answer.locator("sup.cite a")
    await expect(citations).to_have_count(2)
    for n in range(2):
        await expect(citations.nth(n)).to_have_text("1")
        await expect(citations.nth(n)).to_have_attribute("href", url)
    sources = reply.locator(".sources").get_by_role("link")
    await expect(sources).to_have_count(1)  # only what the answer cites
    await expect(sources).to_have_text(title)
    await expect(sources).to_have_attribute("href", url)
    assert (DEMO_SITE / url.lstrip("/")).is_file()
    await page.close()


async def test_a_withdrawn_model_answer_is_replaced_in_the_bubble(
    browser: Browser, start_gateway: StartGateway, llm: FakeLlm
) -> None:
    # The model writes nothing but the prompt's markup: it streams, then is withdrawn.
    llm.fake.replies[MODEL] = ['<source id="1" url="/en/shipping.html"></source>']
    gateway = await start_gateway(with_llm=True)
    page = await open_shop(browser, gateway, "/en/shipping.html")
    await open_chat(page, "Open chat")
    await ask(page, "How long does delivery to Belgium take?")
    frames = await follow_answer(page)
    reply = last_answer(page)
    await expect(reply).to_have_attribute("data-state", "done")
    await expect(reply).to_have_attribute("data-mode", "extractive")
    # The bubble shows what the turn answered in the end: the sources' quote, no markup.
    answer = reply.locator(".answer")
    await expect(answer).to_contain_text("Belgium")
    assert "<source" not in await answer.inner_text()
    assert frames[-1]["text"] == await answer.text_content()
    await expect(reply.locator(".sources").get_by_role("link").first).to_be_visible()
    await page.screenshot(path=str(ARTIFACTS / "withdrawn-answer.png"))
    await page.close()


HOSTILE_IMG = '<img src=x onerror="window.pwned=1">'
HOSTILE_TITLE = f"{HOSTILE_IMG}Hostile"
HOSTILE_ANSWER = f"<script>window.pwned=1</script>The lantern costs 12.34 euro [1]. {HOSTILE_IMG}"
HOSTILE_QUESTION = "How much does the Hostile Test Lantern cost?"
# A clean answer citing the hostile page: its title shows in the sources.
CLEAN_QUESTION = "What is the price of the Hostile Test Lantern in euro?"
CLEAN_ANSWER = "The lantern costs 12.34 euro [1]."


async def test_model_and_page_markup_stay_inert_text(
    browser: Browser, start_gateway: StartGateway, llm: FakeLlm, tmp_path: Path
) -> None:
    answers = {HOSTILE_QUESTION: HOSTILE_ANSWER, CLEAN_QUESTION: CLEAN_ANSWER}
    llm.fake.responder = lambda body: answers.get(body["messages"][-1]["content"], "Lanterns")
    gateway = await start_gateway(with_llm=True)
    hostile = {
        "url": "/en/hostile.html",
        "title": HOSTILE_TITLE,
        "lang": "en",
        "text": f"# Hostile Test Lantern\n{HOSTILE_IMG} The Hostile Test Lantern costs 12.34 euro. "
        "It lights a tent for a whole night.",
    }
    pages = tmp_path / "hostile.jsonl"
    pages.write_text(json.dumps(hostile) + "\n", encoding="utf-8")
    pool = gateway.app[DATABASE].pool
    agent = await Agents(pool).get("demo")
    report = await Ingestor(KnowledgeStore(pool), gateway.app[EMBEDDER]).ingest(
        agent, parse_source(str(pages))
    )
    assert report.added == 1

    page = await open_shop(browser, gateway, "/en/index.html")
    await open_chat(page, "Open chat")
    await ask(page, HOSTILE_QUESTION)
    reply = last_answer(page)
    await expect(reply).to_have_attribute("data-state", "done")

    (request,) = [
        r for r in llm.fake.turn_requests if r["messages"][-1]["content"] == HOSTILE_QUESTION
    ]
    assert prompt_sources(request["messages"][0]["content"])[1][0] == "/en/hostile.html"
    # An answer copying markup fails validation and is withdrawn: the page's own words take
    # its place, its markup shown as typed text, never as elements.
    await expect(reply).to_have_attribute("data-mode", "extractive")
    await expect(reply.locator(".answer")).to_contain_text(
        f"{HOSTILE_IMG} The Hostile Test Lantern costs 12.34 euro."
    )
    await expect(reply.locator(".answer")).not_to_contain_text("<script>")
    assert await page.evaluate(INERT) == {"markup": 0, "handlers": 0}

    await ask(page, CLEAN_QUESTION)
    reply = last_answer(page)
    await expect(reply).to_have_attribute("data-state", "done")
    answer = reply.locator(".answer")
    # Shown as typed, with the citation as a link.
    await expect(answer).to_have_text(CLEAN_ANSWER.replace("[1]", "1"))
    source = reply.locator(".sources").get_by_role("link")
    await expect(source).to_have_text(HOSTILE_TITLE)
    await expect(source).to_have_attribute("href", "/en/hostile.html")
    await expect(answer.locator("sup.cite a")).to_have_attribute(
        "title", f"Source 1: {HOSTILE_TITLE}"
    )
    assert await page.evaluate(INERT) == {"markup": 0, "handlers": 0}
    assert await page.evaluate("typeof window.pwned") == "undefined"
    ARTIFACTS.mkdir(exist_ok=True)
    await page.screenshot(path=ARTIFACTS / "demo.png")
    assert await page.evaluate("typeof window.pwned") == "undefined"
    await page.close()
