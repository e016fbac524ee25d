"""Telegram webhooks on the real app: the secret header, the inbox row, what is ignored."""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestServer

from core.keyring import Keyring
from core.retrieval.embedders import UseEmbedder
from core.store import Agent, Agents, Database
from core.store.inbox import Inbox
from core.store.vector_index import EmbedderIdentity
from gateway.app import create_app
from tests.conftest import SECRETS_KEY, MakeSettings

SECRET = "env-Secret_token-0123456789-abcdefghijkl"
AGENT_SECRET = "agent-secret-9876543210-ZYXWVUTSRQPONMLK"
TOKEN = "admin-token-for-telegram-tests-0123456789"
BOT_TOKEN = "654321:AAHagent-bot-token_0123456789"
DATE = 1_717_000_000

USER = {"id": 555000111, "is_bot": False, "first_name": "Anna", "language_code": "nl"}
PRIVATE = {"id": 555000111, "first_name": "Anna", "type": "private"}
GROUP = {"id": -1001234567890, "title": "Shop fans", "type": "supergroup"}


def update(update_id: int, kind: str = "message", **message: Any) -> dict[str, Any]:
    """An Update in the Bot API's shape, with one message-like object under ``kind``."""
    body = {"message_id": 10 + update_id % 1000, "from": USER, "chat": PRIVATE, "date": DATE}
    return {"update_id": update_id, kind: body | message}


def text(update_id: int, words: str = "Where is my order?", **extra: Any) -> dict[str, Any]:
    return update(update_id, text=words, **extra)


def start_command(update_id: int) -> dict[str, Any]:
    return update(
        update_id, text="/start", entities=[{"offset": 0, "length": 6, "type": "bot_command"}]
    )


def photo(update_id: int, chat: dict[str, Any] = PRIVATE, **extra: Any) -> dict[str, Any]:
    sizes = [
        {"file_id": "AgAC-small", "file_unique_id": "AQAD-s", "file_size": 1200,
         "width": 90, "height": 67},
        {"file_id": "AgAC-large", "file_unique_id": "AQAD-l", "file_size": 54000,
         "width": 800, "height": 600},
    ]  # fmt: skip
    return update(update_id, chat=chat, photo=sizes, **extra)


@dataclass
class Posted:
    status: int
    content_type: str
    body: Any
    headers: Mapping[str, str] = field(default_factory=dict)


@dataclass
class Gateway:
    url: str
    agent: Agent
    agents: Agents
    inbox: Inbox

    async def post(
        self,
        body: bytes | dict[str, Any],
        *,
        secret: str | None = SECRET,
        content_type: str = "application/json",
        agent: str = "shop",
        address: str | None = None,
    ) -> Posted:
        """Deliver ``body``; from ``address`` (as a trusted proxy says) when given."""
        headers = {"Content-Type": content_type}
        if secret is not None:
            headers["X-Telegram-Bot-Api-Secret-Token"] = secret
        if address is not None:
            headers["X-Forwarded-For"] = address
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        async with (
            aiohttp.ClientSession() as session,
            session.post(
                f"{self.url}/webhooks/telegram/{agent}", data=data, headers=headers
            ) as response,
        ):
            raw = await response.read()
            return Posted(
                response.status, response.content_type, json.loads(raw), response.headers.copy()
            )

    async def admin(self, method: str, path: str, body: Any = None) -> Posted:
        """The admin API, with the admin token."""
        async with (
            aiohttp.ClientSession() as session,
            session.request(
                method,
                f"{self.url}/api/v1/admin{path}",
                json=body,
                headers={"Authorization": f"Bearer {TOKEN}"},
            ) as response,
        ):
            raw = await response.read()
            return Posted(
                response.status, response.content_type, json.loads(raw), response.headers.copy()
            )

    async def rows(self) -> list[Any]:
        return await self.inbox.rows(self.agent.id, "telegram")


StartGateway = Callable[..., Awaitable[Gateway]]


@pytest.fixture
async def start(
    make_settings: MakeSettings, database: Database, use_embedder: UseEmbedder
) -> AsyncIterator[StartGateway]:
    """Starts the app built by create_app, with settings overridden; agent 'shop' exists."""
    servers: list[TestServer] = []
    agents = Agents(database.pool, keyring=Keyring(SECRETS_KEY))
    agent = await agents.create("shop", embedder=EmbedderIdentity.of(use_embedder))

    async def start_gateway(**overrides: Any) -> Gateway:
        values = {"telegram_webhook_secret": SECRET, "telegram_bot_token": "123456:ABC-env"}
        server = TestServer(create_app(make_settings(**(values | overrides))))
        await server.start_server()
        servers.append(server)
        url = str(server.make_url("")).rstrip("/")
        return Gateway(url, agent, agents, Inbox(database.pool))

    yield start_gateway
    for server in servers:
        await server.close()


async def test_a_text_message_is_stored_and_acknowledged_with_an_empty_object(
    start: StartGateway,
) -> None:
    gateway = await start()
    sent = text(700001, "Waar blijft mijn bestelling?")
    answered = await gateway.post(sent)
    assert (answered.status, answered.content_type, answered.body) == (
        200,
        "application/json",
        {},
    )
    [row] = await gateway.rows()
    assert row.provider_message_id == "700001"
    assert row.conversation_key == str(PRIVATE["id"])
    assert row.status == "pending"
    assert dict(row.payload) == sent  # kept as sent, for staff
    assert (row.inbound.customer_id, row.inbound.text) == (
        str(PRIVATE["id"]),
        sent["message"]["text"],
    )


async def test_a_text_with_a_nul_is_stored_without_it_and_acknowledged(
    start: StartGateway,
) -> None:
    gateway = await start()
    sent = text(700002, "Waar blijft\u0000 mijn bestelling?")
    answered = await gateway.post(sent)
    assert (answered.status, answered.body) == (200, {})
    [row] = await gateway.rows()
    assert row.payload["message"]["text"] == "Waar blijft mijn bestelling?"


async def test_start_is_stored_for_the_worker_to_welcome(start: StartGateway) -> None:
    gateway = await start()
    assert (await gateway.post(start_command(700002))).status == 200
    [row] = await gateway.rows()
    assert row.payload["message"]["text"] == "/start"
    assert row.payload["message"]["entities"][0]["type"] == "bot_command"


@pytest.mark.parametrize("secret", [None, "", "wrong-secret", SECRET + "x", SECRET[:-1]])
async def test_a_missing_or_wrong_secret_is_403_and_stores_nothing(
    start: StartGateway, secret: str | None, caplog: pytest.LogCaptureFixture
) -> None:
    gateway = await start()
    caplog.set_level(logging.INFO)
    answered = await gateway.post(text(700003), secret=secret)
    assert answered.status == 403
    assert answered.body["error"]["code"] == "forbidden"
    assert await gateway.inbox.count(gateway.agent.id, "telegram") == 0
    assert "telegram.webhook.rejected" in caplog.text
    assert SECRET not in caplog.text
    assert "Where is my order" not in caplog.text


@pytest.mark.parametrize("content_type", ["text/plain", "application/x-www-form-urlencoded"])
async def test_a_body_that_is_not_json_by_content_type_is_403(
    start: StartGateway, content_type: str
) -> None:
    gateway = await start()
    answered = await gateway.post(text(700004), content_type=content_type)
    assert answered.status == 403
    assert await gateway.inbox.count(gateway.agent.id, "telegram") == 0


@pytest.mark.parametrize(
    "body", [b"{not json", b"", b"[1, 2]", b'{"update_id": 1, "message": {"text": "x"}}']
)
async def test_a_malformed_body_is_400_with_the_json_error(
    start: StartGateway, body: bytes
) -> None:
    gateway = await start()
    answered = await gateway.post(body)
    assert answered.status == 400
    assert answered.body["error"]["code"] == "invalid_input"
    assert await gateway.inbox.count(gateway.agent.id, "telegram") == 0


async def test_the_secret_is_checked_before_the_body_is_parsed(start: StartGateway) -> None:
    gateway = await start()
    assert (await gateway.post(b"{not json", secret="wrong")).status == 403


async def test_updates_that_need_no_answer_are_acknowledged_and_not_stored(
    start: StartGateway, caplog: pytest.LogCaptureFixture
) -> None:
    gateway = await start()
    caplog.set_level(logging.INFO)
    channel = {"id": -1009876543210, "title": "Shop news", "type": "channel"}
    joined = {"id": 777, "is_bot": False, "first_name": "Bob"}
    ignored = [
        ("edited_message", update(
            700010, "edited_message", text="Where is my order??", edit_date=DATE + 60
        )),
        ("channel_post", {
            "update_id": 700011,
            "channel_post": {"message_id": 3, "chat": channel, "date": DATE, "text": "Sale!"},
        }),
        ("service", update(
            700012, chat=GROUP, new_chat_members=[joined], new_chat_member=joined,
            new_chat_participant=joined,
        )),
        ("service", update(700013, chat=GROUP, left_chat_member=joined)),
        ("callback_query", {
            "update_id": 700014,
            "callback_query": {
                "id": "4382bfdwdsb323b2d9", "from": USER, "chat_instance": "-12345",
                "data": "more", "message": text(1)["message"],
            },
        }),
        ("group_photo", photo(700015, chat=GROUP)),
        ("my_chat_member", {
            "update_id": 700016,
            "my_chat_member": {
                "chat": PRIVATE, "from": USER, "date": DATE,
                "old_chat_member": {"status": "member", "user": USER},
                "new_chat_member": {"status": "kicked", "user": USER, "until_date": 0},
            },
        }),
    ]  # fmt: skip
    for kind, body in ignored:
        caplog.clear()
        answered = await gateway.post(body)
        assert (answered.status, answered.body) == (200, {}), kind
        assert f"telegram.webhook.ignored agent=shop kind={kind}" in caplog.text
    assert await gateway.rows() == []


async def test_media_in_a_private_chat_is_stored_with_its_kind(start: StartGateway) -> None:
    gateway = await start()
    assert (await gateway.post(photo(700020))).status == 200
    assert (await gateway.post(photo(700021, caption="Do you have this in blue?"))).status == 200
    sticker = update(
        700022,
        sticker={
            "file_id": "CAAC", "file_unique_id": "AgAD", "type": "regular",
            "width": 512, "height": 512, "is_animated": False, "is_video": False, "emoji": "👍",
        },
    )  # fmt: skip
    voice = update(
        700023, voice={"file_id": "AwAC", "file_unique_id": "AgAE", "duration": 3,
                       "mime_type": "audio/ogg"},
    )  # fmt: skip
    assert (await gateway.post(sticker)).status == 200
    assert (await gateway.post(voice)).status == 200
    rows = await gateway.rows()
    assert [
        (r.provider_message_id, r.inbound.text, [(m.kind, m.ref) for m in r.inbound.media])
        for r in rows
    ] == [
        ("700020", "", [("image", "AgAC-large")]),  # the largest size
        ("700021", "Do you have this in blue?", [("image", "AgAC-large")]),
        ("700022", "", [("sticker", "CAAC")]),
        ("700023", "", [("audio", "AwAC")]),
    ]
    assert rows[3].inbound.media[0].mime_type == "audio/ogg"
    assert rows[0].payload["message"]["photo"][1]["file_id"] == "AgAC-large"


async def test_a_redelivered_update_is_acknowledged_and_stored_once(
    start: StartGateway, use_embedder: UseEmbedder
) -> None:
    gateway = await start()
    first = await gateway.post(text(700030))
    again = await gateway.post(text(700030))
    assert (first.status, again.status, again.body) == (200, 200, {})
    assert len(await gateway.rows()) == 1
    assert (await gateway.post(text(700031))).status == 200
    assert [r.provider_message_id for r in await gateway.rows()] == ["700030", "700031"]
    # The same update_id for another agent (another bot) is another delivery.
    cafe = await gateway.agents.create("cafe", embedder=EmbedderIdentity.of(use_embedder))
    assert (await gateway.post(text(700030), agent="cafe")).status == 200
    assert await gateway.inbox.count(cafe.id, "telegram") == 1
    assert len(await gateway.rows()) == 2


async def test_the_agents_own_secret_wins_and_no_secret_at_all_refuses(
    start: StartGateway,
) -> None:
    gateway = await start()
    await gateway.agents.update(
        "shop",
        settings={"telegram": {"bot_token": "654321:XYZ-agent", "webhook_secret": AGENT_SECRET}},
    )
    assert (await gateway.post(text(700040), secret=SECRET)).status == 403
    assert (await gateway.post(text(700041), secret=AGENT_SECRET)).status == 200
    assert [r.provider_message_id for r in await gateway.rows()] == ["700041"]

    unconfigured = await start(telegram_webhook_secret=None, telegram_bot_token=None)
    await gateway.agents.update("shop", settings={})
    refused = await unconfigured.post(text(700042), secret="")
    assert refused.status == 403
    assert refused.body["error"]["code"] == "channel_not_configured"
    assert [r.provider_message_id for r in await gateway.rows()] == ["700041"]


# The test client connects from 127.0.0.1: as a trusted proxy, it says which address each
# request comes from.
PROXY = {"trusted_proxies": ["127.0.0.1/32"]}


async def test_wrong_secrets_from_one_address_are_throttled_and_the_right_one_never_is(
    start: StartGateway,
) -> None:
    """Wrong secrets are counted per address like wrong staff credentials (20, then one more
    every 30 s): then 429 with Retry-After, storing nothing. The right secret is never
    counted or refused, from that address or any other, and another address's wrong ones
    are its own."""
    gateway = await start(**PROXY)
    guesser = "203.0.113.9"
    statuses = [
        (await gateway.post(text(700100 + n), secret=f"guess-{n}", address=guesser)).status
        for n in range(20)
    ]
    assert statuses == [403] * 20
    over = await gateway.post(text(700120), secret="guess-20", address=guesser)
    assert over.status == 429
    assert over.body["error"]["code"] == "rate_limited"
    assert 1 <= int(over.headers["Retry-After"]) <= 30
    missing = await gateway.post(text(700121), secret=None, address=guesser)
    assert missing.status == 429
    assert await gateway.rows() == []

    assert (await gateway.post(text(700122), address="149.154.167.220")).status == 200
    assert (await gateway.post(text(700123), address=guesser)).status == 200
    elsewhere = await gateway.post(text(700124), secret="guess", address="198.51.100.7")
    assert elsewhere.status == 403
    assert [r.provider_message_id for r in await gateway.rows()] == ["700122", "700123"]


@pytest.mark.parametrize(
    ("secret", "complaint"),
    [
        ("hook-secret_1", "32-256 characters"),
        ("x" * 31, "32-256 characters"),
        ("x" * 257, "32-256 characters"),
        ("has spaces but is long enough to pass 32", "A-Z, a-z, 0-9, _ and -"),
        ("ünïcödé-is-not-what-telegram-takes-0123", "A-Z, a-z, 0-9, _ and -"),
    ],
)
async def test_a_weak_or_malformed_webhook_secret_is_refused_when_set(
    start: StartGateway, secret: str, complaint: str
) -> None:
    gateway = await start(admin_token=TOKEN)
    refused = await gateway.admin(
        "PATCH",
        "/agents/shop",
        {"channels": {"telegram": {"bot_token": BOT_TOKEN, "webhook_secret": secret}}},
    )
    assert refused.status in (400, 422), refused.body
    message = refused.body["error"]["message"]
    assert "channels.telegram.webhook_secret" in message
    assert complaint in message
    assert secret not in message
    assert (await gateway.agents.get("shop")).settings == {}
    strong = "S" * 32
    accepted = await gateway.admin(
        "PATCH",
        "/agents/shop",
        {"channels": {"telegram": {"bot_token": BOT_TOKEN, "webhook_secret": strong}}},
    )
    assert accepted.status == 200, accepted.body
    assert (await gateway.post(text(700130), secret=strong)).status == 200


async def test_a_weak_secret_stored_before_still_works_and_is_warned_about_once(
    start: StartGateway, caplog: pytest.LogCaptureFixture
) -> None:
    """A secret shorter than 32 characters stored by an earlier version is still used, so an
    upgrade does not cut a bot off; the log says how to replace it, once."""
    gateway = await start()
    await gateway.agents.update(
        "shop", settings={"telegram": {"bot_token": "654321:XYZ-agent", "webhook_secret": "cafe_1"}}
    )
    caplog.set_level(logging.WARNING, logger="channels.credentials")
    assert (await gateway.post(text(700140), secret="cafe_1")).status == 200
    assert (await gateway.post(text(700141), secret="cafe_1")).status == 200
    warnings = [r.getMessage() for r in caplog.records if "weak" in r.getMessage()]
    assert warnings == [
        "credentials.weak agent=shop field=settings.telegram.webhook_secret: stored before "
        "Parley needed 32-256 characters of A-Z, a-z, 0-9, _ and -; "
        "run `parley telegram set-webhook --agent shop` to replace it"
    ]
    assert "cafe_1" not in caplog.text
