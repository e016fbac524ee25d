"""WhatsApp webhooks from Twilio on the real app: signatures, the inbox row, empty TwiML."""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestServer, make_mocked_request
from multidict import MultiDict, MultiDictProxy
from twilio.request_validator import RequestValidator

from channels.twilio import EMPTY_TWIML, signed_url
from core.inbound import InboundMessage, MediaItem
from core.keyring import Keyring
from core.retrieval.embedders import UseEmbedder
from core.store import Agent, Agents, Database
from core.store.inbox import Inbox
from core.store.vector_index import EmbedderIdentity
from gateway.app import create_app
from tests.conftest import SECRETS_KEY, MakeSettings

ENV_TOKEN = "env-auth-token-0123456789abcdef"
AGENT_TOKEN = "agent-auth-token-fedcba9876543210"
SID = "SM" + "1" * 32


def message(sid: str = SID, **changes: str) -> dict[str, str]:
    """An inbound WhatsApp message as Twilio posts it (form fields)."""
    fields = {
        "SmsMessageSid": sid,
        "NumMedia": "0",
        "ProfileName": "Anna",
        "MessageType": "text",
        "SmsSid": sid,
        "WaId": "31612345678",
        "SmsStatus": "received",
        "Body": "Where is my order?",
        "To": "whatsapp:+14155238886",
        "NumSegments": "1",
        "ReferralNumMedia": "0",
        "MessageSid": sid,
        "AccountSid": "AC" + "a" * 32,
        "From": "whatsapp:+31612345678",
        "ApiVersion": "2010-04-01",
    }
    return fields | changes


@dataclass
class Posted:
    status: int
    content_type: str
    text: str

    def json(self) -> Any:
        return json.loads(self.text)


@dataclass
class Gateway:
    url: str
    agent: Agent
    agents: Agents
    inbox: Inbox

    async def post(self, path: str, fields: dict[str, str], *, signature: str | None) -> Posted:
        headers = {} if signature is None else {"X-Twilio-Signature": signature}
        async with (
            aiohttp.ClientSession() as session,
            session.post(self.url + path, data=fields, headers=headers) as response,
        ):
            return Posted(response.status, response.content_type, await response.text())

    async def signed_post(
        self, path: str, fields: dict[str, str], *, token: str = ENV_TOKEN, signed_for: str = ""
    ) -> Posted:
        url = (signed_for or self.url) + path
        signature = RequestValidator(token).compute_signature(url, fields)
        return await self.post(path, fields, signature=signature)

    async def rows(self) -> list[Any]:
        return await self.inbox.rows(self.agent.id, "whatsapp")


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
        settings = make_settings(**({"twilio_auth_token": ENV_TOKEN} | overrides))
        server = TestServer(create_app(settings))
        await server.start_server()
        servers.append(server)
        url = str(server.make_url("")).rstrip("/")
        return Gateway(url, agent, agents, Inbox(database.pool))

    yield start_gateway
    for server in servers:
        await server.close()


def test_the_vendor_vectors_through_our_url_and_form_handling() -> None:
    """twilio-python's own vectors (tests/unit/test_request_validator.py), checked the way
    the webhook checks: the URL from `signed_url`, the fields as the MultiDictProxy that
    aiohttp's ``request.post()`` returns."""
    params = {
        "CallSid": "CA1234567890ABCDE",
        "Digits": "1234",
        "From": "+14158675309",
        "To": "+18005551212",
        "Caller": "+14158675309",
    }
    expected = "RSOYDt4T1cUTdK1PDd93/VVr8B8="
    behind_proxy = make_mocked_request(
        "POST", "/myapp.php?foo=1&bar=2", headers={"Host": "127.0.0.1:8080"}
    )
    url = signed_url(behind_proxy, "https://mycompany.com")
    assert url == "https://mycompany.com/myapp.php?foo=1&bar=2"
    validator = RequestValidator("12345")
    form = MultiDictProxy(MultiDict(params))
    assert validator.validate(url, form, expected)
    assert not validator.validate(url, form, "RSOYDt4T1cUTdK1PDd93/VVr8B9=")
    assert not RequestValidator("54321").validate(url, form, expected)
    # The request's own URL (no public URL configured) is another URL: refused.
    assert signed_url(behind_proxy, None) == "http://127.0.0.1:8080/myapp.php?foo=1&bar=2"
    assert not validator.validate(signed_url(behind_proxy, None), form, expected)
    # A repeated field, as a form can carry it: every value is signed.
    repeated = MultiDictProxy(
        MultiDict(
            [("Sid", "CA123"), ("SidAccount", "AC123"), ("Digits", "5678"), ("Digits", "1234")]
        )
    )
    assert validator.validate(url, repeated, "IK+Dwps556ElfBT0I3Rgjkr1wJU=")


async def test_a_signed_message_is_stored_with_every_field_and_answered_with_empty_twiml(
    start: StartGateway,
) -> None:
    gateway = await start()
    fields = message(ChannelMetadata='{"type":"whatsapp"}', SomeFieldTwilioAddsLater="x")
    answered = await gateway.signed_post("/webhooks/twilio/shop", fields)
    assert answered.status == 200
    assert answered.content_type == "text/xml"
    assert answered.text == EMPTY_TWIML == '<?xml version="1.0" encoding="UTF-8"?><Response/>'
    [row] = await gateway.rows()
    assert row.provider_message_id == SID
    assert row.conversation_key == "whatsapp:+31612345678"
    assert row.status == "pending"
    assert dict(row.payload) == fields  # kept as sent, for staff
    assert row.inbound == InboundMessage(
        customer_id="whatsapp:+31612345678",
        provider_message_id=SID,
        text=fields["Body"],
        display_name=fields.get("ProfileName"),
    )


@pytest.mark.parametrize("signature", ["", None, "RSOYDt4T1cUTdK1PDd93/VVr8B8=", "not base64!"])
async def test_a_missing_or_wrong_signature_is_403_and_stores_nothing(
    start: StartGateway, signature: str | None, caplog: pytest.LogCaptureFixture
) -> None:
    gateway = await start()
    caplog.set_level(logging.INFO)
    answered = await gateway.post("/webhooks/twilio/shop", message(), signature=signature)
    assert answered.status == 403
    assert answered.content_type == "application/json"
    assert answered.json()["error"]["code"] == "forbidden"
    assert await gateway.inbox.count(gateway.agent.id, "whatsapp") == 0
    [rejected] = [r for r in caplog.records if r.getMessage().startswith("twilio.webhook.rejected")]
    logged = rejected.getMessage()
    assert "agent=shop" in logged
    assert "reason=" in logged
    assert "31612345678" not in caplog.text
    assert "Where is my order" not in caplog.text
    assert ENV_TOKEN not in caplog.text


async def test_a_signature_with_another_token_or_other_fields_is_refused(
    start: StartGateway,
) -> None:
    gateway = await start()
    wrong_token = await gateway.signed_post(
        "/webhooks/twilio/shop", message(), token="someone-elses-token"
    )
    assert wrong_token.status == 403
    # Signed for one body, sent with another: the signature covers every field.
    fields = message()
    signature = RequestValidator(ENV_TOKEN).compute_signature(
        gateway.url + "/webhooks/twilio/shop", fields
    )
    tampered = await gateway.post(
        "/webhooks/twilio/shop", fields | {"Body": "Refund me"}, signature=signature
    )
    assert tampered.status == 403
    # Signed for another agent's URL.
    other_agent = await gateway.post(
        "/webhooks/twilio/shop",
        message(),
        signature=RequestValidator(ENV_TOKEN).compute_signature(
            gateway.url + "/webhooks/twilio/cafe", message()
        ),
    )
    assert other_agent.status == 403
    assert await gateway.inbox.count(gateway.agent.id, "whatsapp") == 0


async def test_behind_a_proxy_the_public_url_is_what_was_signed(start: StartGateway) -> None:
    gateway = await start(public_url="https://bot.example.com")
    path = "/webhooks/twilio/shop?x=1"
    proxied = await gateway.signed_post(path, message(), signed_for="https://bot.example.com")
    assert proxied.status == 200
    assert proxied.content_type == "text/xml"
    assert len(await gateway.rows()) == 1
    # Signed for the address the request arrived at, which Twilio never sees: refused.
    local = await gateway.signed_post(path, message("SM" + "2" * 32))
    assert local.status == 403
    # The query string is signed too.
    dropped_query = await gateway.signed_post(
        "/webhooks/twilio/shop", message("SM" + "3" * 32), signed_for="https://bot.example.com"
    )
    assert dropped_query.status == 200
    moved_query = await gateway.post(
        path,
        message("SM" + "4" * 32),
        signature=RequestValidator(ENV_TOKEN).compute_signature(
            "https://bot.example.com/webhooks/twilio/shop", message("SM" + "4" * 32)
        ),
    )
    assert moved_query.status == 403
    # Signed with the default port spelled out, as Twilio sometimes does: the same address.
    with_port = await gateway.signed_post(
        path, message("SM" + "5" * 32), signed_for="https://bot.example.com:443"
    )
    assert with_port.status == 200
    assert len(await gateway.rows()) == 3


async def test_a_redelivery_is_acknowledged_and_stored_once(start: StartGateway) -> None:
    gateway = await start()
    first = await gateway.signed_post("/webhooks/twilio/shop", message())
    again = await gateway.signed_post("/webhooks/twilio/shop", message())
    assert (first.status, again.status) == (200, 200)
    assert again.text == EMPTY_TWIML
    assert len(await gateway.rows()) == 1
    other = await gateway.signed_post("/webhooks/twilio/shop", message("SM" + "5" * 32))
    assert other.status == 200
    assert [r.provider_message_id for r in await gateway.rows()] == [SID, "SM" + "5" * 32]


async def test_a_picture_is_stored_as_media_with_its_caption(start: StartGateway) -> None:
    gateway = await start()
    photo = message(
        Body="",
        NumMedia="1",
        MessageType="image",
        MediaUrl0="https://api.twilio.com/2010-04-01/Accounts/AC/Messages/SM/Media/ME1",
        MediaContentType0="image/jpeg",
    )
    captioned = photo | {"MessageSid": "SM" + "6" * 32, "Body": "Is this the right size?"}
    assert (await gateway.signed_post("/webhooks/twilio/shop", photo)).status == 200
    assert (await gateway.signed_post("/webhooks/twilio/shop", captioned)).status == 200
    first, second = await gateway.rows()
    picture = MediaItem("image", photo["MediaUrl0"], "image/jpeg")
    assert (first.inbound.text, first.inbound.media) == ("", (picture,))
    assert (second.inbound.text, second.inbound.media) == ("Is this the right size?", (picture,))


async def test_the_agents_own_credentials_win_over_the_environment(
    start: StartGateway, use_embedder: UseEmbedder
) -> None:
    gateway = await start()
    await gateway.agents.update(
        "shop",
        settings={
            "twilio": {
                "account_sid": "AC" + "b" * 32,
                "auth_token": AGENT_TOKEN,
                "whatsapp_from": "whatsapp:+14155238886",
            }
        },
    )
    with_env_token = await gateway.signed_post("/webhooks/twilio/shop", message())
    assert with_env_token.status == 403
    with_agent_token = await gateway.signed_post(
        "/webhooks/twilio/shop", message(), token=AGENT_TOKEN
    )
    assert with_agent_token.status == 200
    assert len(await gateway.rows()) == 1
    # An agent without a block of its own still uses the environment's account.
    await gateway.agents.create("cafe", embedder=EmbedderIdentity.of(use_embedder))
    cafe = await gateway.signed_post("/webhooks/twilio/cafe", message())
    assert cafe.status == 200


async def test_without_any_credentials_webhooks_are_refused(start: StartGateway) -> None:
    gateway = await start(twilio_auth_token=None)
    answered = await gateway.signed_post("/webhooks/twilio/shop", message(), token="anything")
    assert answered.status == 403
    assert answered.json()["error"]["code"] == "channel_not_configured"
    assert await gateway.inbox.count(gateway.agent.id, "whatsapp") == 0


async def test_unknown_agent_is_404_and_status_callbacks_are_not_messages(
    start: StartGateway,
) -> None:
    gateway = await start()
    unknown = await gateway.signed_post("/webhooks/twilio/nope", message())
    assert unknown.status == 404
    status = await gateway.signed_post(
        "/webhooks/twilio/shop",
        {"MessageSid": SID, "MessageStatus": "delivered", "From": "whatsapp:+14155238886"},
    )
    assert status.status == 200
    assert status.content_type == "text/xml"
    assert await gateway.rows() == []
    incomplete = await gateway.signed_post("/webhooks/twilio/shop", {"Body": "hi"})
    assert incomplete.status == 400
