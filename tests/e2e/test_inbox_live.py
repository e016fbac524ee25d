"""The inbox, live, in headless Chromium: a visitor's open widget shows a staff member typing
in the console; the console's keyboard shortcuts and their help; the privacy page one click
from a conversation, for admins only; deleting a saved reply; and a WhatsApp reply's delivery
state changing on the open conversation page."""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import aiohttp
import asyncpg
import pytest
from aiohttp.test_utils import TestServer
from playwright.async_api import Browser, BrowserContext, Dialog, Page, expect
from twilio.request_validator import RequestValidator

from core.retrieval.embedders import UseEmbedder
from core.store import Agents, Database
from core.store.agents import Agent
from core.store.staff import StaffAccounts
from core.store.vector_index import EmbedderIdentity
from gateway.app import create_app
from gateway.demo import DEMO_SITE, DemoSite
from tests.conftest import MakeSettings
from tests.e2e.browser import ARTIFACTS, chromium, open_chat, widget
from tests.fakes.twilio import FakeTwilio
from tests.support.waiting import wait_until

PASSWORD = "correct horse battery staple"
ANNA = "anna@shop.example"  # admin
BRAM = "bram@shop.example"  # agent: may not export or erase customers
PAGE = "/nl/retourneren.html"
SESSION = "visitor-session-0001"  # the widget's session: the web conversation's key
WHATSAPP = "whatsapp:+31612345678"
PUBLIC_URL = "https://bot.example.com"
WHATSAPP_FROM = "whatsapp:+14155238886"

# Eleven exchanges: the conversation page and the widget are long, as a real one gets.
QUESTIONS = [
    "Hoe lang heb ik om iets te retourneren?",
    "Moet het in de originele doos?",
    "Wie betaalt de verzendkosten van een retour?",
    "Kan ik ook in de winkel in Utrecht retourneren?",
    "Wanneer krijg ik mijn geld terug?",
    "Mijn jas is te klein, kan ik ruilen?",
    "Heb ik een retourlabel nodig?",
    "Waar vind ik mijn ordernummer?",
    "De doos is beschadigd aangekomen, wat nu?",
    "Kan ik een deel van mijn bestelling retourneren?",
    "Ik wil graag iemand spreken over mijn retour.",
]
ANSWERS = [
    "Je kunt elk artikel binnen 30 dagen retourneren.",
    "Graag wel, of in een andere stevige verpakking.",
    "Een retour binnen Nederland is gratis; daarbuiten betaal je de verzending zelf.",
    "Ja, neem je bon of orderbevestiging mee.",
    "Het geld staat binnen 5 werkdagen op je rekening.",
    "Ja, ruilen kan binnen 30 dagen, zolang de voorraad strekt.",
    "Ja, je maakt het aan in je account onder Bestellingen.",
    "In je bevestigingsmail en in je account.",
    "Maak een foto en stuur die met je ordernummer naar ons team.",
    "Ja, je kiest per artikel wat je terugstuurt.",
    "Ik vraag een collega om mee te kijken.",
]


SHORTCUT_KEYS = ["j / k", "o or Enter", "r", "n", "e", "a", "/", "?", "Esc"]


@dataclass
class Seeded:
    agent: Agent
    anna: int  # Anna's staff account
    web: int  # the visitor's conversation (the widget's session)
    whatsapp: int


@dataclass
class Shop:
    server: TestServer
    pool: asyncpg.Pool
    data: Seeded

    def url(self, path: str) -> str:
        return str(self.server.make_url(path))


async def _conversation(
    pool: asyncpg.Pool, agent_id: int, channel: str, key: str, name: str
) -> int:
    """A conversation of 22 messages, the last a minute ago (WhatsApp's window is open)."""
    conversation: int = await pool.fetchval(
        """INSERT INTO conversations (agent_id, channel, conversation_key, customer_name)
           VALUES ($1, $2, $3, $4) RETURNING id""",
        agent_id, channel, key, name,
    )  # fmt: skip
    start = datetime.now(UTC) - timedelta(minutes=len(QUESTIONS) + 1)
    for n, (question, answer) in enumerate(zip(QUESTIONS, ANSWERS, strict=True)):
        await pool.execute(
            """INSERT INTO messages (conversation_id, role, text, created_at)
               VALUES ($1, 'visitor', $2, $4), ($1, 'assistant', $3, $4)""",
            conversation, question, answer, start + timedelta(minutes=n),
        )  # fmt: skip
    return conversation


async def _seed(pool: asyncpg.Pool, use_embedder: UseEmbedder) -> Seeded:
    agent = await Agents(pool).create(
        "shop", embedder=EmbedderIdentity.of(use_embedder), name="Noordkaap"
    )
    accounts = StaffAccounts(pool)
    anna = await accounts.create(ANNA, PASSWORD, display_name="Anna", role="admin")
    await accounts.create(BRAM, PASSWORD, display_name="Bram", role="agent")
    whatsapp = await _conversation(pool, agent.id, "whatsapp", WHATSAPP, "Pieter Jansen")
    web = await _conversation(pool, agent.id, "web", SESSION, "Marieke de Vries")
    for title, text in (
        ("Bedankt", "Bedankt {{customer_name}}, fijne dag nog!"),
        ("Retourlabel", "Hoi {{customer_name}}, {{agent_name}} hier: je retourlabel staat in je mail."),
    ):  # fmt: skip
        await pool.execute(
            "INSERT INTO saved_replies (agent_id, title, text) VALUES ($1, $2, $3)",
            agent.id, title, text,
        )  # fmt: skip
    return Seeded(agent, anna.id, web, whatsapp)


@pytest.fixture
async def browser() -> AsyncIterator[Browser]:
    async with chromium() as launched:
        yield launched


async def _sign_in(context: BrowserContext, shop: Shop, email: str) -> Page:
    page = await context.new_page()
    await page.goto(shop.url("/admin/sign-in"))
    await page.locator("#email").fill(email)
    await page.locator("#password").fill(PASSWORD)
    await page.get_by_role("button", name="Sign in", exact=True).click()
    await expect(page.get_by_role("heading", name="Conversations", exact=True)).to_be_visible()
    return page


def _widget_history() -> str:
    """A script giving the visitor's widget the web conversation's session and history, as a
    visitor who has been chatting for a while has them in the browser."""
    items: list[dict[str, str]] = []
    for question, answer in zip(QUESTIONS, ANSWERS, strict=True):
        items += [{"role": "user", "text": question}, {"role": "bot", "text": answer}]
    saved = json.dumps({"session": SESSION, "items": items})
    return f"""
      if (!localStorage.getItem("parley:shop:session")) {{
        localStorage.setItem("parley:shop:session", {json.dumps(SESSION)});
        localStorage.setItem("parley:shop:history", {json.dumps(saved)});
      }}"""


async def _accept(dialog: Dialog) -> None:
    await dialog.accept()


async def _shortcut_help(page: Page, shots: str) -> None:
    """The help, opened by "?", screenshot at desk and phone widths, closed by Escape."""
    await page.keyboard.press("?")
    help = page.get_by_role("dialog", name="Keyboard shortcuts")
    await expect(help.locator("dt")).to_have_text(SHORTCUT_KEYS)
    for width, height in ((1280, 800), (360, 740)):
        await page.set_viewport_size({"width": width, "height": height})
        await page.screenshot(path=ARTIFACTS / f"{shots}-{width}.png")
        # Every line of the help fits its dialog, and the dialog the screen.
        box = await help.bounding_box()
        assert box is not None
        assert box["x"] >= 0
        assert box["x"] + box["width"] <= width
        assert await help.evaluate("el => el.scrollWidth <= el.clientWidth")
        assert await help.evaluate("el => el.scrollHeight <= el.clientHeight")  # nothing cut off
    await page.keyboard.press("Escape")
    await expect(help).to_be_hidden()
    await page.set_viewport_size({"width": 1280, "height": 800})


@pytest.fixture
async def shop(
    make_settings: MakeSettings, database: Database, use_embedder: UseEmbedder
) -> AsyncIterator[Shop]:
    """The demo shop's pages with the widget, and the console, on one gateway."""
    data = await _seed(database.pool, use_embedder)
    demo = DemoSite(DEMO_SITE, "shop", data.agent.widget_key)
    server = TestServer(create_app(make_settings(), demo))
    await server.start_server()
    try:
        yield Shop(server, database.pool, data)
    finally:
        await server.close()


async def test_typing_reaches_the_widget_shortcuts_privacy_link_and_deleting_a_saved_reply(
    shop: Shop, browser: Browser
) -> None:
    ARTIFACTS.mkdir(exist_ok=True)
    visiting = await browser.new_context(viewport={"width": 1280, "height": 800})
    await visiting.add_init_script(_widget_history())
    visitor = await visiting.new_page()
    await visitor.goto(shop.url(PAGE))
    await open_chat(visitor)
    chat = widget(visitor)
    await expect(chat.locator(".msg.user")).to_have_count(len(QUESTIONS))

    desk = await browser.new_context(viewport={"width": 1280, "height": 800})
    staff = await _sign_in(desk, shop, ANNA)

    # -- the list's shortcuts, and the help a button (or "?") opens ---------------------------
    rows = staff.locator("table.conversations tbody tr")
    await expect(rows).to_have_count(2)
    await staff.get_by_role("button", name="Shortcuts").click()
    help = staff.get_by_role("dialog", name="Keyboard shortcuts")
    await expect(help.locator("dt")).to_have_text(SHORTCUT_KEYS)
    await staff.keyboard.press("?")
    await expect(help).to_be_hidden()
    await staff.keyboard.press("/")
    await expect(staff.locator("#filter-q")).to_be_focused()
    await staff.keyboard.press("Escape")
    await expect(staff.locator("#filter-q")).not_to_be_focused()
    selected = re.compile(r"\bselected\b")
    await staff.keyboard.press("j")
    await expect(rows.nth(0)).to_have_class(selected)
    await staff.keyboard.press("j")
    await expect(rows.nth(1)).to_have_class(selected)
    await expect(rows.nth(0)).not_to_have_class(selected)
    await staff.keyboard.press("k")
    await expect(rows.nth(0)).to_have_class(selected)
    await expect(rows.nth(0)).to_contain_text("Marieke de Vries")  # the newest
    await staff.keyboard.press("o")
    await expect(
        staff.get_by_role("heading", name="Conversation with Marieke de Vries")
    ).to_be_visible()
    await expect(staff.locator(".transcript .msg")).to_have_count(2 * len(QUESTIONS))

    # -- a conversation's shortcuts ------------------------------------------------------------
    await staff.get_by_role("button", name="Keyboard shortcuts").click()
    await expect(help).to_be_visible()
    # Behind the open help a key does nothing: "e" would have resolved the conversation.
    await staff.keyboard.press("e")
    await staff.keyboard.press("?")
    await expect(help).to_be_hidden()
    await staff.keyboard.press("a")
    await expect(staff.get_by_role("status")).to_have_text("Assignment changed.")
    await expect(staff.locator("#assign-to")).to_have_value(str(shop.data.anna))
    status = "SELECT inbox_status FROM conversations WHERE id = $1"
    assert await shop.pool.fetchval(status, shop.data.web) == "open"
    await staff.keyboard.press("n")
    await expect(staff.locator("#note-text")).to_be_focused()
    await staff.keyboard.press("Escape")
    await staff.keyboard.press("r")
    await expect(staff.locator("#reply-text")).to_be_focused()
    await staff.keyboard.press("Escape")

    # -- "Anna is typing" in the widget, gone once she stops, and once she sends -------------
    await staff.get_by_role("button", name="Take over").click()
    await expect(chat.locator(".note")).to_have_text(
        "Een medewerker van ons team neemt nu deel aan het gesprek."
    )
    typing = chat.locator(".staff-typing")
    await expect(typing).to_be_hidden()
    reply = staff.get_by_label("Reply to the customer")
    await reply.press_sequentially("Hoi Marieke, ")
    await expect(typing).to_have_text("Anna typt…")  # in the page's language
    await visitor.screenshot(path=ARTIFACTS / "inbox-live-widget-typing-1280.png")
    await expect(typing).to_be_hidden(timeout=12_000)  # she stopped: it goes by itself
    # The visitor's phone too (another tab of the same session), its log read to the end.
    phone = await visiting.new_page()
    await phone.set_viewport_size({"width": 360, "height": 740})
    await phone.goto(shop.url(PAGE))
    await open_chat(phone, "Chat openen")
    await reply.press_sequentially("ik kijk even mee.")
    await expect(typing).to_be_visible()
    await expect(widget(phone).locator(".staff-typing")).to_have_text("Anna typt…")
    # The indicator takes its line from the log, which stays at its end: nothing is hidden.
    log = widget(phone).locator(".log")
    assert await log.evaluate("el => el.scrollHeight - el.scrollTop - el.clientHeight") <= 1
    await phone.screenshot(path=ARTIFACTS / "inbox-live-widget-typing-360.png")
    await staff.get_by_role("button", name="Send reply").click()
    sent = chat.locator(".msg.staff")
    await expect(sent).to_contain_text("Hoi Marieke, ik kijk even mee.")
    # Gone with the message itself, not seconds later.
    assert await typing.is_hidden()
    await expect(staff.get_by_role("status")).to_have_text("Your reply is on its way.")
    await expect(staff.locator(".msg.staff")).to_contain_text("Hoi Marieke, ik kijk even mee.")

    # -- the privacy page, one click away, with the customer filled in -----------------------
    privacy = staff.get_by_role("link", name="Export or erase this customer's data")
    await expect(privacy).to_have_attribute(
        "href", f"/admin/agents/shop/privacy?channel=web&id={SESSION}"
    )
    conversation_url = staff.url
    await _shortcut_help(staff, "inbox-live-shortcuts")
    await staff.screenshot(path=ARTIFACTS / "inbox-live-conversation-1280.png", full_page=True)
    await staff.set_viewport_size({"width": 360, "height": 740})
    await staff.screenshot(path=ARTIFACTS / "inbox-live-conversation-360.png", full_page=True)
    assert await staff.evaluate("document.documentElement.scrollWidth") <= 360
    await staff.set_viewport_size({"width": 1280, "height": 800})
    await privacy.click()
    await expect(staff.get_by_role("heading", name="Privacy · Noordkaap")).to_be_visible()
    for form in ("Export a customer's data", "Erase a customer's data"):
        region = staff.get_by_role("region", name=form)
        await expect(region.get_by_label("Channel")).to_have_value("web")
        await expect(region.get_by_label("Customer id", exact=True)).to_have_value(SESSION)

    # -- deleting a saved reply where they are managed ---------------------------------------
    await staff.goto(conversation_url)
    picker = staff.locator("[data-saved-reply] option")
    await expect(picker).to_have_text(["Choose…", "Bedankt", "Retourlabel"])
    await staff.get_by_role("link", name="Manage").click()
    saved = staff.locator(".saved-reply-list li")
    await expect(saved).to_have_count(2)
    await staff.screenshot(path=ARTIFACTS / "inbox-live-saved-replies-1280.png", full_page=True)
    staff.once("dialog", _accept)  # "Delete the saved reply ...?"
    await staff.get_by_role("button", name="Delete the saved reply Retourlabel").click()
    await expect(staff.get_by_role("status")).to_have_text("Saved reply deleted.")
    await expect(saved).to_have_count(1)
    await expect(saved).to_contain_text("Bedankt")
    titles = await shop.pool.fetch("SELECT title FROM saved_replies ORDER BY title")
    assert [r["title"] for r in titles] == ["Bedankt"]
    await staff.goto(conversation_url)
    await expect(picker).to_have_text(["Choose…", "Bedankt"])
    # Searching is the list's: "/" on a conversation goes there, ready to type.
    await staff.keyboard.press("/")
    await staff.wait_for_url("**/admin/conversations#search", timeout=10_000)
    await expect(staff.locator("#filter-q")).to_be_focused()

    # -- an agent (not an admin) is not offered the privacy page -----------------------------
    other = await browser.new_context(viewport={"width": 1280, "height": 800})
    bram = await _sign_in(other, shop, BRAM)
    await bram.goto(conversation_url)
    await expect(bram.get_by_role("heading", name="Conversation with Marieke")).to_be_visible()
    await expect(bram.get_by_role("button", name="Keyboard shortcuts")).to_be_visible()
    await expect(bram.get_by_role("link", name=re.compile("Export or erase"))).to_have_count(0)
    answer = await bram.goto(shop.url(f"/admin/agents/shop/privacy?channel=web&id={SESSION}"))
    assert answer is not None
    assert answer.status == 403
    for context in (visiting, desk, other):
        await context.close()


@dataclass
class Twilio:
    fake: FakeTwilio
    server: TestServer


@pytest.fixture
async def twilio() -> AsyncIterator[Twilio]:
    fake = FakeTwilio()
    server = TestServer(fake.app())
    await server.start_server()
    try:
        yield Twilio(fake, server)
    finally:
        await server.close()


@pytest.fixture
async def sending_shop(
    make_settings: MakeSettings, database: Database, use_embedder: UseEmbedder, twilio: Twilio
) -> AsyncIterator[Shop]:
    """The console on a gateway whose outbox sender sends WhatsApp replies (to a fake Twilio)
    and which takes Twilio's delivery reports."""
    data = await _seed(database.pool, use_embedder)
    settings = make_settings(
        twilio_account_sid=twilio.fake.account_sid,
        twilio_auth_token=twilio.fake.auth_token,
        twilio_whatsapp_from=WHATSAPP_FROM,
        twilio_api_base=str(twilio.server.make_url("")).rstrip("/"),
        public_url=PUBLIC_URL,
    )
    server = TestServer(create_app(settings, background=True))
    await server.start_server()
    try:
        yield Shop(server, database.pool, data)
    finally:
        await server.close()


async def _report(shop: Shop, twilio: Twilio, sid: str, status: str) -> None:
    """A delivery report as Twilio posts it to the reply's status callback."""
    path = "/webhooks/twilio/status?agent=shop"
    fields = {
        "MessageSid": sid, "SmsSid": sid, "MessageStatus": status, "SmsStatus": status,
        "AccountSid": twilio.fake.account_sid, "To": WHATSAPP, "From": WHATSAPP_FROM,
        "ApiVersion": "2010-04-01",
    }  # fmt: skip
    signature = RequestValidator(twilio.fake.auth_token).compute_signature(
        PUBLIC_URL + path, fields
    )
    async with (
        aiohttp.ClientSession() as session,
        session.post(
            shop.url(path), data=fields, headers={"X-Twilio-Signature": signature}
        ) as answer,
    ):
        assert answer.status == 200, await answer.text()


async def test_a_whatsapp_reply_goes_from_queued_to_sent_to_delivered_on_the_open_page(
    sending_shop: Shop, twilio: Twilio, browser: Browser
) -> None:
    shop = sending_shop
    ARTIFACTS.mkdir(exist_ok=True)
    desk = await browser.new_context(viewport={"width": 1280, "height": 800})
    staff = await _sign_in(desk, shop, ANNA)
    await staff.goto(shop.url(f"/admin/conversations/{shop.data.whatsapp}"))
    await expect(staff.locator(".transcript .msg")).to_have_count(2 * len(QUESTIONS))
    text = "Hoi Pieter, je retourlabel staat in je mail."
    await staff.get_by_label("Reply to the customer").fill(text)
    await staff.get_by_role("button", name="Send reply").click()
    await expect(staff.get_by_role("status")).to_have_text("Your reply is on its way.")
    mine = staff.locator(".msg.staff").filter(has_text=text).locator(".delivery")
    # From here on the page is never loaded again: what changes, changes in place.
    await staff.evaluate("window.sameDocument = true")

    outbox = """SELECT o.status FROM outbox o JOIN messages m ON m.id = o.message_id
                 WHERE m.conversation_id = $1 AND m.role = 'staff'"""

    def reached(status: str) -> Callable[[], Awaitable[bool]]:
        async def check() -> bool:
            return await shop.pool.fetchval(outbox, shop.data.whatsapp) == status

        return check

    await wait_until(reached("sent"))  # the outbox sender sent it...
    [message] = twilio.fake.messages
    assert (message["to"], message["body"]) == (WHATSAPP, text)
    await expect(mine).to_have_text("sent", timeout=10_000)  # ...and the open page says so
    await _report(shop, twilio, message["sid"], "delivered")
    await wait_until(reached("delivered"))
    await expect(mine).to_have_text("delivered", timeout=10_000)
    assert await staff.evaluate("window.sameDocument === true")

    await staff.screenshot(path=ARTIFACTS / "inbox-live-delivered-1280.png", full_page=True)
    await _shortcut_help(staff, "inbox-live-delivered-shortcuts")
    await staff.set_viewport_size({"width": 360, "height": 740})
    await staff.screenshot(path=ARTIFACTS / "inbox-live-delivered-360.png", full_page=True)
    await desk.close()
