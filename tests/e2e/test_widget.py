"""The chat bubble in headless Chromium against a scripted chat endpoint, and the demo routes."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from playwright.async_api import Browser, Page, expect
from pytest_aiohttp import AiohttpClient, AiohttpServer

from gateway.demo import DEMO_SITE, WIDGET_JS, demo_routes, widget_routes
from tests.e2e.browser import ARTIFACTS, ask, chromium, last_answer, open_chat, widget

KEY = "pk_test_0123456789"
PRODUCT_PAGE = "/nl/producten/stormvang-3l.html"

# ------------------------------------------------------------------ the scripted chat endpoint

GATE = object()  # in a script: hold the stream until the test calls FakeChat.release()
Step = Any  # (kind, data) | GATE | ("http", status, body, content_type)


def sse_frame(kind: str, data: dict[str, Any]) -> bytes:
    """One event as an unhurried server might write it: CRLF, data spread over several lines."""
    lines = [f"event: {kind}"] + [
        f"data: {line}" for line in json.dumps(data, indent=1).split("\n")
    ]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


@dataclass
class FakeChat:
    """Speaks the widget's SSE contract from scripts, one per request (the last one repeats)."""

    scripts: list[Sequence[Step]] = field(default_factory=list)
    requests: list[dict[str, Any]] = field(default_factory=list)
    gate: asyncio.Semaphore = field(default_factory=lambda: asyncio.Semaphore(0))

    def release(self) -> None:
        self.gate.release()

    async def handle(self, request: web.Request) -> web.StreamResponse:
        self.requests.append({"headers": dict(request.headers), "body": await request.json()})
        script = self.scripts[min(len(self.requests), len(self.scripts)) - 1]
        if script and script[0][0] == "http":
            _, status, body, content_type = script[0]
            return web.Response(status=status, text=body, content_type=content_type)
        response = web.StreamResponse(
            headers={
                "Content-Type": "text/event-stream; charset=utf-8",
                "Cache-Control": "no-cache",
            }
        )
        await response.prepare(request)
        await response.write(b": keep-alive\r\n\r\n")
        for step in script:
            if step is GATE:
                await asyncio.wait_for(self.gate.acquire(), 15)
                continue
            frame = sse_frame(*step)
            # Two writes cut mid-frame (often mid-character): the parser must not care.
            await response.write(frame[: len(frame) // 2 + 1])
            await response.write(frame[len(frame) // 2 + 1 :])
        await response.write_eof()
        return response


def answer_script(text: str, sources: list[dict[str, Any]] | None = None) -> list[Step]:
    return [
        ("status", {"step": "searching"}),
        ("status", {"step": "answering"}),
        *[("token", {"text": word}) for word in re.findall(r"\S+\s*", text)],
        ("sources", {"sources": sources or []}),
        ("done", done(text)),
    ]


def done(answer: str) -> dict[str, Any]:
    return {
        "conversation_id": "c-1",
        "turn_id": "t-1",
        "confidence": 0.8,
        "low_confidence": False,
        "citations": [],
        "answer": answer,
        "mode": "llm",
    }


HOSTILE_PAGE = """<!doctype html><html lang="pt-BR"><head><title>Hostile</title><style>
* { color: red !important; font: 40px/1 serif !important; box-sizing: content-box !important;
    background: yellow !important; border: 5px solid red !important; }
body * { display: none !important; position: static !important; transform: scale(0.1) !important; }
button, div, textarea { width: 1px !important; height: 1px !important; opacity: 0 !important; }
</style></head><body><main><h1>Olá</h1></main>
<script src="/widget.js" data-agent="demo" data-key="pk_test_0123456789"
        data-include-tags="Pricing, lang:pt,no tag!" data-exclude-tags="internal" async></script>
</body></html>"""


def site_app(fake: FakeChat) -> web.Application:
    """The demo shop with the widget, a hostile page, and the fake chat endpoint."""

    async def hostile(request: web.Request) -> web.Response:
        return web.Response(text=HOSTILE_PAGE, content_type="text/html")

    app = web.Application()
    app.router.add_post("/api/v1/agents/{agent}/chat", fake.handle)
    app.router.add_get("/hostile.html", hostile)
    app.add_routes(widget_routes())
    app.add_routes(demo_routes(DEMO_SITE, "demo", KEY))
    return app


# ------------------------------------------------------------------ fixtures and helpers


@pytest.fixture
async def browser() -> AsyncIterator[Browser]:
    async with chromium() as launched:
        yield launched


@pytest.fixture
def fake() -> FakeChat:
    return FakeChat()


@pytest.fixture
async def site(aiohttp_server: AiohttpServer, fake: FakeChat) -> TestServer:
    return await aiohttp_server(site_app(fake))


async def open_page(
    browser: Browser,
    site: TestServer,
    path: str = PRODUCT_PAGE,
    width: int = 1280,
    height: int = 800,
) -> Page:
    page = await browser.new_page(viewport={"width": width, "height": height})
    await page.goto(str(site.make_url(path)))
    return page


async def session_in_storage(page: Page) -> str:
    return await page.evaluate("localStorage.getItem('parley:demo:session')")


# ------------------------------------------------------------------ the visitor's view

STREAMED = [
    "De Stormvang 3L ",
    "kost **€ 249,00** en is waterdicht [1]. ",
    "Verzending naar België duurt 1–2 werkdagen [2]. [NOTITIE: bron 3 genegeerd]",
]
FINAL = (
    "De Stormvang 3L kost **€ 249,00** en is waterdicht [1]. "
    "Verzending naar België duurt 1–2 werkdagen [2]."
)
SOURCES = [
    {"id": 1, "url": PRODUCT_PAGE, "title": "Stormvang 3L", "score": 0.83},
    {
        "id": 2,
        "url": "https://shop.example/nl/verzending.html",
        "title": "Verzending",
        "score": 0.71,
    },
    {"id": 3, "url": "javascript:window.pwned=1", "title": "Kwaadaardig", "score": 0.5},
]


async def test_dutch_question_streams_an_answer_with_sources(
    browser: Browser, site: TestServer, fake: FakeChat
) -> None:
    fake.scripts = [
        [
            ("status", {"step": "searching"}),
            GATE,
            ("status", {"step": "reading"}),
            ("status", {"step": "answering"}),
            ("token", {"text": STREAMED[0]}),
            GATE,
            ("token", {"text": STREAMED[1]}),
            GATE,
            ("token", {"text": STREAMED[2]}),
            ("sources", {"sources": SOURCES}),
            ("done", done(FINAL)),
        ]
    ]
    page = await open_page(browser, site)
    await open_chat(page)
    # Dutch page, Dutch interface; the input has the focus.
    await expect(widget(page).get_by_role("heading", name="Stel een vraag")).to_be_visible()
    await expect(widget(page).get_by_role("button", name="Nieuw gesprek")).to_be_visible()
    await expect(widget(page).get_by_role("textbox", name="Typ je vraag…")).to_be_focused()
    await expect(widget(page).get_by_role("log")).to_have_attribute("aria-live", "polite")

    await ask(page, "Is de Stormvang waterdicht en hoe snel is hij in België?")
    await expect(page.locator("parley-chat .msg.user")).to_have_text(
        "Jij: Is de Stormvang waterdicht en hoe snel is hij in België?"
    )
    reply = last_answer(page)
    await expect(reply.locator(".status")).to_have_text("Zoeken…")
    fake.release()
    answer = reply.locator(".answer")
    await expect(answer).to_have_text("De Stormvang 3L")  # first intermediate state
    await expect(reply.locator(".status")).to_be_hidden()
    fake.release()
    await expect(answer).to_have_text("De Stormvang 3L kost € 249,00 en is waterdicht 1.")
    await expect(answer.locator("strong")).to_have_text("€ 249,00")
    await expect(reply).to_have_attribute("data-state", "streaming")
    fake.release()

    await expect(reply).to_have_attribute("data-state", "done")
    # The final answer replaces what streamed (the copied note is gone).
    await expect(answer).to_have_text(
        "De Stormvang 3L kost € 249,00 en is waterdicht 1. Verzending naar België duurt 1–2 werkdagen 2."
    )
    await expect(widget(page).get_by_text("Bronnen", exact=True)).to_be_visible()
    source = reply.locator(".sources").get_by_role("link", name="Stormvang 3L")
    await expect(source).to_have_attribute("href", PRODUCT_PAGE)
    await expect(source).to_have_attribute("target", "_blank")
    await expect(source).to_have_attribute("rel", "noopener")
    await expect(reply.locator(".sources a")).to_have_count(2)  # the javascript: one is dropped
    await expect(reply.locator(".sources")).not_to_contain_text("Kwaadaardig")
    citations = answer.locator("sup.cite a")
    await expect(citations).to_have_count(2)
    await expect(citations.nth(0)).to_have_attribute("href", PRODUCT_PAGE)
    await expect(citations.nth(1)).to_have_attribute(
        "href", "https://shop.example/nl/verzending.html"
    )
    await expect(widget(page).get_by_role("log")).not_to_have_attribute("aria-busy", "true")

    ARTIFACTS.mkdir(exist_ok=True)
    await page.screenshot(path=ARTIFACTS / "widget.png")

    # What the gateway was sent.
    (request,) = fake.requests
    assert request["headers"]["X-Parley-Key"] == KEY
    assert request["headers"]["Content-Type"] == "application/json"
    body = request["body"]
    assert body["message"] == "Is de Stormvang waterdicht en hoe snel is hij in België?"
    assert body["session_id"] == await session_in_storage(page)
    assert re.fullmatch(r"[A-Za-z0-9_-]{8,100}", body["session_id"])
    assert body["language"] == "nl"
    assert body["page"]["url"] == str(site.make_url(PRODUCT_PAGE))
    assert body["page"]["title"].startswith("Stormvang 3L – Waterdichte")
    context = body["page"]["context"]
    assert len(context) <= 4000
    for fact in (
        "Description: Stormvang 3L (NK-3102)",  # meta description
        "sku: NK-3102",  # JSON-LD
        "price: 249.00",
        "priceCurrency: EUR",
        "availability: InStock",
        "brand name: Noordkaap",
        "Headings: Stormvang 3L | Kenmerken | Kleuren en maten",
        "Drielaags laminaat met een waterkolom",  # main text
    ):
        assert fact in context
    for chrome in ("Deze website gebruikt cookies", "Klantenservice", "Hoofdmenu", "Nieuwsbrief"):
        assert chrome not in context
    await page.close()


async def test_model_and_source_text_cannot_inject_markup(
    browser: Browser, site: TestServer, fake: FakeChat
) -> None:
    evil = (
        'Let op: <script>window.pwned=1</script> en <img src=x onerror="window.pwned=1"> '
        "**vet** [klik](javascript:window.pwned=1) [veilig](https://example.com/ok) [1]"
    )
    fake.scripts = [
        answer_script(
            evil,
            [
                {
                    "id": 1,
                    "url": "https://shop.example/a",
                    "title": "<img src=x onerror=window.pwned=1>",
                },
                {"id": 2, "url": "javascript:window.pwned=1", "title": "js"},
                {"id": 3, "url": "//evil.example/x", "title": "protocol-relative"},
            ],
        )
    ]
    page = await open_page(browser, site)
    await open_chat(page)
    await ask(page, "Vertel eens iets")
    reply = last_answer(page)
    await expect(reply).to_have_attribute("data-state", "done")
    answer = reply.locator(".answer")
    await expect(answer).to_contain_text("<script>window.pwned=1</script>")
    await expect(answer).to_contain_text('<img src=x onerror="window.pwned=1">')
    await expect(answer.locator("strong")).to_have_text("vet")
    await expect(answer.get_by_role("link", name="veilig")).to_have_attribute(
        "href", "https://example.com/ok"
    )
    await expect(answer.get_by_role("link", name="klik")).to_have_count(0)
    await expect(reply.locator(".sources").get_by_role("link")).to_have_text(
        ["<img src=x onerror=window.pwned=1>"]
    )
    counts = await page.evaluate(
        """() => {
            const root = document.querySelector('parley-chat').shadowRoot;
            return {
                markup: root.querySelectorAll('script, img, iframe, object, embed').length,
                handlers: [...root.querySelectorAll('*')].filter(
                    (el) => [...el.attributes].some((a) => a.name.startsWith('on'))).length,
                scriptLinks: [...root.querySelectorAll('a')].filter(
                    (a) => !/^(https?:|\\/[^/\\\\])/.test(a.getAttribute('href'))).length,
            };
        }"""
    )
    assert counts == {"markup": 0, "handlers": 0, "scriptLinks": 0}
    assert await page.evaluate("typeof window.pwned") == "undefined"
    await page.close()


async def test_llm_failed_is_retried_once_automatically(
    browser: Browser, site: TestServer, fake: FakeChat
) -> None:
    fake.scripts = [
        [
            ("status", {"step": "searching"}),
            ("error", {"code": "llm_failed", "message": "no words"}),
        ],
        answer_script("Ja, binnen 30 dagen [1].", [SOURCES[0]]),
    ]
    page = await open_page(browser, site)
    await open_chat(page)
    await ask(page, "Kan ik retourneren?")
    reply = last_answer(page)
    await expect(reply).to_have_attribute("data-state", "done")
    await expect(reply.locator(".answer")).to_have_text("Ja, binnen 30 dagen 1.")
    await expect(reply).to_have_attribute("data-attempt", "2")
    await expect(page.locator("parley-chat .msg.bot.error")).to_have_count(0)
    first, second = fake.requests
    assert first["body"]["message"] == second["body"]["message"] == "Kan ik retourneren?"
    assert first["body"]["session_id"] == second["body"]["session_id"]

    # Failing again after the retry: a friendly message and a manual retry, no third request.
    fake.scripts = [[("error", {"code": "llm_failed", "message": "no words"})]]
    fake.requests.clear()
    await ask(page, "En ruilen?")
    reply = last_answer(page)
    await expect(reply).to_have_attribute("data-state", "error")
    await expect(reply).to_contain_text("Sorry, het lukte nu niet om een antwoord te geven.")
    await expect(reply.get_by_role("button", name="Opnieuw proberen")).to_be_visible()
    assert len(fake.requests) == 2
    await page.close()


async def test_http_errors_become_friendly_messages(
    browser: Browser, site: TestServer, fake: FakeChat
) -> None:
    rate = json.dumps({"error": {"code": "rate_limited", "message": "slow down"}})
    cases = [
        (("http", 429, rate, "application/json"), "Je stuurt snel achter elkaar berichten."),
        (("http", 403, '{"error": {}}', "application/json"), "De chat is op deze pagina niet"),
        (("http", 502, "Bad Gateway", "text/plain"), "Er ging bij ons iets mis."),
        (("error", {"code": "rate_limited", "message": "x"}), "Je stuurt snel achter elkaar"),
        (("token", {"text": "Half "}), "Sorry, het lukte nu niet"),  # stream ends, no done
    ]
    page = await open_page(browser, site)
    await open_chat(page)
    for step, shown in cases:
        fake.scripts = [[step]]
        await ask(page, "Hallo?")
        reply = last_answer(page)
        await expect(reply).to_have_attribute("data-state", "error")
        await expect(reply).to_contain_text(shown)
    await page.close()


async def test_new_conversation_starts_a_fresh_session(
    browser: Browser, site: TestServer, fake: FakeChat
) -> None:
    fake.scripts = [answer_script("De winkel is zaterdag open van 10 tot 17 uur.")]
    page = await open_page(browser, site)
    await open_chat(page)
    await ask(page, "Wanneer is de winkel open?")
    await expect(last_answer(page)).to_have_attribute("data-state", "done")
    first = await session_in_storage(page)

    # The conversation survives a page change.
    await page.reload()
    await open_chat(page)
    await expect(page.locator("parley-chat .msg.user")).to_have_text(
        ["Jij: Wanneer is de winkel open?"]
    )
    await expect(last_answer(page).locator(".answer")).to_have_text(
        "De winkel is zaterdag open van 10 tot 17 uur."
    )

    await widget(page).get_by_role("button", name="Nieuw gesprek").click()
    await expect(page.locator("parley-chat .msg.user")).to_have_count(0)
    await expect(page.locator("parley-chat .msg.bot:not(.greeting)")).to_have_count(0)
    await expect(widget(page).get_by_text("Hallo! Waarmee kunnen we je helpen?")).to_be_visible()
    await expect(widget(page).get_by_role("textbox")).to_be_focused()
    second = await session_in_storage(page)
    assert second != first
    assert await page.evaluate("ParleyWidget.sessionId") == second

    await ask(page, "En op zondag?")
    await expect(last_answer(page)).to_have_attribute("data-state", "done")
    assert [r["body"]["session_id"] for r in fake.requests] == [first, second]
    await page.close()


async def test_keyboard_enter_shift_enter_and_escape(
    browser: Browser, site: TestServer, fake: FakeChat
) -> None:
    fake.scripts = [answer_script("Prima.")]
    page = await open_page(browser, site)
    launcher = widget(page).get_by_role("button", name="Chat openen")
    await expect(launcher).to_have_attribute("aria-expanded", "false")
    await launcher.focus()
    await page.keyboard.press("Enter")
    box = widget(page).get_by_role("textbox")
    await expect(box).to_be_focused()
    await page.keyboard.type("eerste regel")
    await page.keyboard.press("Shift+Enter")
    await page.keyboard.type("tweede regel")
    await expect(box).to_have_value("eerste regel\ntweede regel")
    assert fake.requests == []
    await page.keyboard.press("Enter")
    await expect(last_answer(page)).to_have_attribute("data-state", "done")
    assert fake.requests[0]["body"]["message"] == "eerste regel\ntweede regel"
    await page.keyboard.press("Escape")
    await expect(widget(page).get_by_role("dialog")).to_be_hidden()
    closed = widget(page).get_by_role("button", name="Chat openen")
    await expect(closed).to_be_focused()
    await expect(closed).to_have_attribute("aria-expanded", "false")
    await page.close()


async def test_panel_takes_the_full_width_of_a_small_phone(
    browser: Browser, site: TestServer, fake: FakeChat
) -> None:
    fake.scripts = [answer_script("Ja, dat kan [1].", [SOURCES[0]])]
    page = await open_page(browser, site, width=360, height=640)
    launcher = widget(page).get_by_role("button", name="Chat openen")
    box = await launcher.bounding_box()
    assert box is not None
    assert box["x"] + box["width"] <= 360
    assert box["y"] + box["height"] <= 640
    await open_chat(page)
    panel = await widget(page).get_by_role("dialog").bounding_box()
    assert panel == {"x": 0, "y": 0, "width": 360, "height": 640}
    await ask(page, "Kan ik met iDEAL betalen?")
    await expect(last_answer(page)).to_have_attribute("data-state", "done")
    for control in ("textbox", "log"):
        inside = await widget(page).get_by_role(control).bounding_box()
        assert inside is not None
        assert inside["x"] >= 0
        assert inside["x"] + inside["width"] <= 360
    assert await page.evaluate("document.documentElement.scrollWidth") <= 360
    ARTIFACTS.mkdir(exist_ok=True)
    await page.screenshot(path=ARTIFACTS / "widget-360.png")
    await widget(page).get_by_role("button", name="Chat sluiten").click()
    await expect(widget(page).get_by_role("dialog")).to_be_hidden()
    await page.close()


async def test_host_page_css_cannot_break_the_bubble(
    browser: Browser, site: TestServer, fake: FakeChat
) -> None:
    # `body *` rather than `*`: `* { display: none }` hides <html> itself, and then no
    # element of the page can render at all.
    fake.scripts = [answer_script("Hello!")]
    page = await open_page(browser, site, "/hostile.html")
    await expect(page.get_by_role("heading", name="Olá")).to_be_hidden()
    launcher = widget(page).get_by_role("button", name="Open chat")  # pt-BR falls back to English
    await expect(launcher).to_be_visible()
    box = await launcher.bounding_box()
    assert box == {"x": 1280 - 20 - 56, "y": 800 - 20 - 56, "width": 56, "height": 56}
    await open_chat(page, "Open chat")
    title = widget(page).get_by_role("heading", name="Ask a question")
    await expect(title).to_be_visible()
    await expect(title).to_have_css("color", "rgb(255, 255, 255)")
    await expect(title).to_have_css("font-size", "16px")
    panel = await widget(page).get_by_role("dialog").bounding_box()
    assert panel is not None
    assert panel["width"] == 380
    await ask(page, "Hi")
    await expect(last_answer(page).locator(".answer")).to_have_text("Hello!")
    assert fake.requests[0]["body"]["language"] == "pt"
    # The script tag's tag filters go with each question; what is no tag is left out.
    assert fake.requests[0]["body"]["filters"] == {
        "include_tags": ["pricing", "lang:pt"],
        "exclude_tags": ["internal"],
    }
    await page.close()


async def test_sse_parser_handles_any_chunking(browser: Browser, site: TestServer) -> None:
    page = await open_page(browser, site, "/en/index.html")
    result = await page.evaluate(
        """() => {
            const stream = ': comment\\r\\n\\r\\n' +
                'event: token\\r\\ndata: {"text":\\r\\ndata: "é😀"}\\r\\n\\r\\n' +
                'retry: 1000\\nid: 7\\nevent:status\\ndata:{"step":"reading"}\\n\\n' +
                'data: plain\\rdata:  two spaces\\r\\r' +
                'event: empty\\n\\n' +
                'event: done\\ndata: {}\\n\\n' +
                'event: partial\\ndata: never dispatched';
            const parse = (chunks) => {
                const events = [];
                const p = ParleyWidget._internals.createSseParser((e) => events.push(e));
                chunks.forEach((c) => p.feed(c));
                p.end();
                return JSON.stringify(events);
            };
            const whole = parse([stream]);
            const failures = [];
            for (let i = 0; i <= stream.length; i++) {
                for (let j = i; j <= stream.length; j += 7) {
                    const split = parse([stream.slice(0, i), stream.slice(i, j), stream.slice(j)]);
                    if (split !== whole) failures.push([i, j]);
                }
            }
            const oneByOne = parse(Array.from(stream));
            return {whole: JSON.parse(whole), failures: failures.length, oneByOne: oneByOne === whole};
        }"""
    )
    assert result["failures"] == 0
    assert result["oneByOne"]
    assert result["whole"] == [
        {"event": "token", "data": '{"text":\n"é😀"}', "id": ""},
        {"event": "status", "data": '{"step":"reading"}', "id": "7"},
        {"event": "message", "data": "plain\n two spaces", "id": "7"},
        {"event": "done", "data": "{}", "id": "7"},
    ]
    await page.close()


async def test_markdown_renders_to_elements(browser: Browser, site: TestServer) -> None:
    page = await open_page(browser, site, "/en/index.html")
    html = await page.evaluate(
        """(text) => {
            const sources = {cite: (n) => {
                const s = document.createElement('sup'); s.textContent = n; return s; }};
            const div = document.createElement('div');
            div.append(ParleyWidget._internals.renderMarkdown(text, sources));
            return div.innerHTML;
        }""",
        "Intro with *italic*, _also_, snake_case_name and `x < y`:\n"
        "- first **bold**\n- second, see https://shop.example/a_(b).\n\n"
        "3. three\n4. four [1, 2]\n\n"
        "Line one\nline two [docs](/en/faq.html) [bad](data:text/html,x)",
    )
    assert html == (
        "<p>Intro with <em>italic</em>, <em>also</em>, snake_case_name and <code>x &lt; y</code>:</p>"
        "<ul><li>first <strong>bold</strong></li><li>second, see "
        '<a href="https://shop.example/a_(b)" target="_blank" rel="noopener">'
        "https://shop.example/a_(b)</a>.</li></ul>"
        '<ol start="3"><li>three</li><li>four <sup>1</sup><sup>2</sup></li></ol>'
        '<p>Line one<br>line two <a href="/en/faq.html" target="_blank" rel="noopener">docs</a> bad</p>'
    )
    await page.close()


# ------------------------------------------------------------------ the demo routes


def demo_app(*, widget_first: bool = True, site_dir: Path = DEMO_SITE) -> web.Application:
    app = web.Application()
    tables = [widget_routes(), demo_routes(site_dir, "demo", KEY)]
    for table in tables if widget_first else reversed(tables):
        app.add_routes(table)
    return app


SCRIPT_TAG = f'<script src="/widget.js" data-agent="demo" data-key="{KEY}" async></script>\n'


async def test_demo_pages_get_the_widget_and_stay_otherwise_identical(
    aiohttp_client: AiohttpClient,
) -> None:
    client = await aiohttp_client(demo_app())
    for path, file in [
        (PRODUCT_PAGE, PRODUCT_PAGE),
        ("/", "/index.html"),
        ("/en/", "/en/index.html"),
        ("/warranty.html", "/warranty.html"),
    ]:
        response = await client.get(path)
        assert response.status == 200, path
        assert response.content_type == "text/html"
        assert response.charset == "utf-8"
        body = await response.read()
        original = (DEMO_SITE / file.lstrip("/")).read_bytes()
        assert body.count(SCRIPT_TAG.encode()) == 1
        assert body.replace(SCRIPT_TAG.encode(), b"") == original
        assert body.index(SCRIPT_TAG.encode()) + len(SCRIPT_TAG) == body.rindex(b"</body>")
    for path, kind in [("/robots.txt", "text/plain"), ("/sitemap.xml", "xml")]:
        response = await client.get(path)
        assert response.status == 200
        assert kind in response.content_type
        assert await response.read() == (DEMO_SITE / path.lstrip("/")).read_bytes()
    for missing in ("/nope.html", "/en/nope/", "/nl/producten/"):
        assert (await client.get(missing)).status == 404


async def test_demo_escapes_the_agent_and_key(aiohttp_client: AiohttpClient) -> None:
    app = web.Application()
    app.add_routes(demo_routes(DEMO_SITE, 'a"b', 'pk_"><script>alert(1)</script>'))
    client = await aiohttp_client(app)
    body = await (await client.get("/")).text()
    assert 'data-agent="a&quot;b"' in body
    assert 'data-key="pk_&quot;&gt;&lt;script&gt;alert(1)&lt;/script&gt;"' in body


async def raw_get(server: TestServer, target: str) -> tuple[int, bytes]:
    """A request sent byte for byte, so that no client library normalises the path first."""
    reader, writer = await asyncio.open_connection(server.host, server.port)
    writer.write(f"GET {target} HTTP/1.1\r\nHost: demo\r\nConnection: close\r\n\r\n".encode())
    await writer.drain()
    reply = await reader.read()
    writer.close()
    await writer.wait_closed()
    head, _, body = reply.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), body


@pytest.mark.parametrize(
    "target",
    [
        "/../pyproject.toml",
        "/../../../pyproject.toml",
        "/%2e%2e/%2e%2e/%2e%2e/pyproject.toml",
        "/%2E%2E%2F%2E%2E%2F%2E%2E%2Fpyproject.toml",
        "/en/..%2f..%2f..%2f..%2fpyproject.toml",
        "/..%5c..%5c..%5cpyproject.toml",
        "//etc/passwd",
        "/%2fetc%2fpasswd",
        "/en/%00.html",
    ],
)
async def test_demo_refuses_paths_outside_the_site(
    aiohttp_client: AiohttpClient, target: str
) -> None:
    client = await aiohttp_client(demo_app())
    status, body = await raw_get(client.server, target)
    assert status in (400, 404)
    assert b"[project]" not in body
    assert b"root:" not in body


async def test_demo_refuses_hidden_files_and_links_out(
    aiohttp_client: AiohttpClient, tmp_path: Path
) -> None:
    site_dir = tmp_path / "site"
    site_dir.mkdir()
    (site_dir / "index.html").write_text("<html><body>hi</body></html>")
    (site_dir / ".env").write_text("SECRET=1")
    (tmp_path / "outside.html").write_text("<html><body>secret</body></html>")
    (site_dir / "link.html").symlink_to(tmp_path / "outside.html")
    client = await aiohttp_client(demo_app(site_dir=site_dir))
    assert (await client.get("/")).status == 200
    assert (await client.get("/.env")).status == 404
    assert (await client.get("/link.html")).status == 404


@pytest.mark.parametrize("widget_first", [True, False])
async def test_widget_js_is_cacheable_and_revalidates(
    aiohttp_client: AiohttpClient, widget_first: bool
) -> None:
    client = await aiohttp_client(demo_app(widget_first=widget_first))
    response = await client.get("/widget.js")
    assert response.status == 200
    assert response.content_type == "application/javascript"
    assert response.headers["Cache-Control"] == "public, max-age=300"
    etag = response.headers["ETag"]
    assert re.fullmatch(r'"[0-9a-f]{32}"', etag)  # strong: no W/ prefix
    assert await response.read() == WIDGET_JS.read_bytes()

    for given in (etag, f"W/{etag}", f'"other", {etag}', "*"):
        again = await client.get("/widget.js", headers={"If-None-Match": given})
        assert again.status == 304, given
        assert again.headers["ETag"] == etag
        assert await again.read() == b""
    changed = await client.get("/widget.js", headers={"If-None-Match": '"something-else"'})
    assert changed.status == 200
    head = await client.head("/widget.js")
    assert head.status == 200
    assert head.headers["ETag"] == etag


async def test_widget_js_without_the_demo(aiohttp_client: AiohttpClient) -> None:
    app = web.Application()
    app.add_routes(widget_routes())
    client = await aiohttp_client(app)
    assert (await client.get("/widget.js")).status == 200
    assert (await client.get("/")).status == 404
