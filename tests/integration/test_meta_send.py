"""Sending WhatsApp replies through Meta's Cloud API, and fetching media, against a local Graph API."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
from pytest_aiohttp import AiohttpServer

from channels.meta import META
from channels.meta_send import MetaSender
from core.delivery import DeliveryError, Template
from core.errors import MediaUnavailable
from core.knowledge.outbound import crawler_session
from core.retrieval.embedders import UseEmbedder
from core.settings import Settings
from core.store import Agents, Database
from core.store.vector_index import EmbedderIdentity
from tests.conftest import MakeSettings
from tests.fakes.media import FakeMediaHost, MediaFile
from tests.fakes.meta import RE_ENGAGEMENT, THROTTLED, Failure, FakeMeta, Media
from tests.support.services import LOOPBACK

CUSTOMER = "31612345678"
WAMID = "wamid.HBgLMzE2MTIzNDU2NzgVAgASGBQzQUZBQjY4MEQ4QzE1QjE0NUY1RAA="


@pytest.fixture
def fake() -> FakeMeta:
    return FakeMeta()


@pytest.fixture
async def graph(fake: FakeMeta, aiohttp_server: AiohttpServer) -> str:
    server = await aiohttp_server(fake.app())
    return str(server.make_url("")).rstrip("/")


@pytest.fixture
async def sender(fake: FakeMeta, graph: str) -> AsyncIterator[MetaSender]:
    sender = MetaSender(
        fake.access_token, fake.phone_number_id, api_base=graph, timeout=2.0, typing_interval=0.05
    )
    yield sender
    await sender.close()


async def test_a_part_is_sent_as_text_with_the_bearer_token(
    sender: MetaSender, fake: FakeMeta
) -> None:
    sent = await sender.send(CUSTOMER, "Your order ships tomorrow. https://shop.example/track")
    [message] = fake.messages
    assert sent.provider_message_id == message["id"]
    assert sent.provider_message_id.startswith("wamid.")
    assert message["body"] == {
        "messaging_product": "whatsapp",
        "recipient_type": "individual",
        "to": CUSTOMER,
        "type": "text",
        "text": {
            "body": "Your order ships tomorrow. https://shop.example/track",
            "preview_url": True,
        },
    }
    assert fake.unauthorized == []
    assert fake.access_token not in repr(sender)
    # A part is never split: above the limit is a bug upstream, refused before any call.
    with pytest.raises(DeliveryError) as too_long:
        await sender.send(CUSTOMER, "x" * 4097)
    assert (too_long.value.code, too_long.value.permanent) == ("too_long", True)
    assert len(fake.requests) == 1


async def test_a_wrong_token_is_permanent_and_not_quoted(fake: FakeMeta, graph: str) -> None:
    wrong = "EAAGwrongTokenWrongTokenWrongToken000"
    sender = MetaSender(wrong, fake.phone_number_id, api_base=graph, timeout=2.0)
    try:
        with pytest.raises(DeliveryError) as refused:
            await sender.send(CUSTOMER, "Hello")
    finally:
        await sender.close()
    assert (refused.value.code, refused.value.permanent) == ("190", True)
    assert [u["authorization"] for u in fake.unauthorized] == [f"Bearer {wrong}"]
    assert wrong not in str(refused.value)
    assert wrong not in repr(refused.value)


async def test_outside_the_24_hour_window_is_permanent(sender: MetaSender, fake: FakeMeta) -> None:
    fake.fail_next.append(RE_ENGAGEMENT)
    with pytest.raises(DeliveryError) as refused:
        await sender.send(CUSTOMER, "Hello again")
    assert refused.value.code == "131047"
    assert refused.value.permanent
    assert refused.value.retry_after is None
    assert not refused.value.ambiguous
    assert fake.messages == []


@pytest.mark.parametrize(
    ("failure", "retry_after"),
    [
        (THROTTLED, 7.0),  # 429, code 130429, Retry-After: 7
        (Failure(130429, 400), None),  # the code says throttled even without a 429
        (Failure(131056, 400, "2"), 2.0),  # too many to one customer
        (Failure(131000, 500), None),  # Meta's own trouble
    ],
)
async def test_throttling_and_server_trouble_are_transient(
    sender: MetaSender, fake: FakeMeta, failure: Failure, retry_after: float | None
) -> None:
    fake.fail_next.append(failure)
    with pytest.raises(DeliveryError) as refused:
        await sender.send(CUSTOMER, "Hello")
    assert refused.value.code == str(failure.code)
    assert not refused.value.permanent
    assert refused.value.retry_after == retry_after
    sent = await sender.send(CUSTOMER, "Hello")  # the next attempt goes through
    assert [m["id"] for m in fake.messages] == [sent.provider_message_id]


async def test_no_answer_after_the_request_went_out_is_ambiguous(
    fake: FakeMeta, graph: str
) -> None:
    fake.delay = 1.0
    sender = MetaSender(fake.access_token, fake.phone_number_id, api_base=graph, timeout=0.2)
    try:
        with pytest.raises(DeliveryError) as unanswered:
            await sender.send(CUSTOMER, "Hello")
    finally:
        await sender.close()
    assert (unanswered.value.code, unanswered.value.ambiguous) == ("timeout", True)
    assert not unanswered.value.permanent


async def test_keep_typing_marks_the_message_read_and_renews_until_the_answer(
    sender: MetaSender, fake: FakeMeta
) -> None:
    until = asyncio.Event()
    typing = asyncio.create_task(sender.keep_typing(CUSTOMER, WAMID, until))
    for _ in range(200):
        if len(fake.reads) >= 2:
            break
        await asyncio.sleep(0.01)
    until.set()
    await asyncio.wait_for(typing, 1.0)
    assert len(fake.reads) >= 2  # renewed while the answer is being written
    assert fake.reads[0] == {"message_id": WAMID, "typing": {"type": "text"}}
    assert fake.requests[0]["json"] == {
        "messaging_product": "whatsapp",
        "status": "read",
        "message_id": WAMID,
        "typing_indicator": {"type": "text"},
    }
    # A permanent refusal ends it at once, though the answer is not there yet.
    calls = len(fake.requests)
    fake.fail_next.append(Failure(100, 400))
    await asyncio.wait_for(sender.keep_typing(CUSTOMER, WAMID, asyncio.Event()), 1.0)
    assert len(fake.requests) == calls + 1


async def test_a_template_is_sent_with_its_language_and_values(
    sender: MetaSender, fake: FakeMeta
) -> None:
    template = Template("follow_up", "order_follow_up", "nl", "Hoi {{1}}, je vraag over {{2}}?")
    sent = await sender.send_template(CUSTOMER, template, ["Sam", "retouren"])
    [message] = fake.messages
    assert sent.provider_message_id == message["id"]
    assert message["body"] == {
        "messaging_product": "whatsapp",
        "recipient_type": "individual",
        "to": CUSTOMER,
        "type": "template",
        "template": {
            "name": "order_follow_up",
            "language": {"code": "nl"},
            "components": [
                {
                    "type": "body",
                    "parameters": [
                        {"type": "text", "text": "Sam"},
                        {"type": "text", "text": "retouren"},
                    ],
                }
            ],
        },
    }


async def test_media_is_fetched_by_its_id_with_the_token_and_bounded(
    fake: FakeMeta, graph: str, make_settings: MakeSettings, database: Database,
    use_embedder: UseEmbedder,
) -> None:  # fmt: skip
    agent = await Agents(database.pool).create("shop", embedder=EmbedderIdentity.of(use_embedder))
    fake.media["1013859600285441"] = Media(b"OggS" + b"\x00" * 1000, "audio/ogg; codecs=opus")

    def settings(**overrides: Any) -> Settings:
        return make_settings(
            meta_app_secret=fake.app_secret,
            meta_verify_token="meta-verify-token-0123456789",
            meta_access_token=fake.access_token,
            meta_api_base=graph,
            **overrides,
        )

    async with crawler_session(LOOPBACK) as http:
        data, kind = await META.fetch_media(http, agent, settings(), "1013859600285441")
        assert (data, kind) == (fake.media["1013859600285441"].data, "audio/ogg")
        assert [r["path"] for r in fake.requests] == [
            "/v21.0/1013859600285441",
            "/media/1013859600285441",
        ]
        assert fake.unauthorized == []
        with pytest.raises(MediaUnavailable) as too_large:
            await META.fetch_media(http, agent, settings(media_max_bytes=100), "1013859600285441")
        assert (too_large.value.reason, too_large.value.transient) == ("too_large", False)
        assert len(fake.requests) == 3  # refused on the size Meta gave, before the download
        with pytest.raises(MediaUnavailable) as not_an_id:
            await META.fetch_media(http, agent, settings(), "../../v21.0/me")
        assert not_an_id.value.reason == "url"
        assert len(fake.requests) == 3  # a ref that is no media id never reaches a URL


async def test_the_token_goes_to_the_graph_api_and_not_to_another_host(
    fake: FakeMeta, graph: str, make_settings: MakeSettings, database: Database,
    use_embedder: UseEmbedder, aiohttp_server: AiohttpServer,
) -> None:  # fmt: skip
    """The Graph API is asked for the media's URL with the token; a URL it gives on a host
    that is not Meta's is read without it."""
    agent = await Agents(database.pool).create("shop", embedder=EmbedderIdentity.of(use_embedder))
    voice = b"OggS" + b"\x01" * 500
    elsewhere = FakeMediaHost(files={"/v/voice.ogg": MediaFile(voice, "audio/ogg")})
    server = await aiohttp_server(elsewhere.app(), host="127.0.0.2")
    url = str(server.make_url("/v/voice.ogg").with_query(oh="signed"))
    fake.media["1013859600285442"] = Media(voice, "audio/ogg", url=url)
    settings = make_settings(
        meta_app_secret=fake.app_secret,
        meta_verify_token="meta-verify-token-0123456789",
        meta_access_token=fake.access_token,
        meta_api_base=graph,
    )

    async with crawler_session(LOOPBACK) as http:
        data, kind = await META.fetch_media(http, agent, settings, "1013859600285442")

    assert (data, kind) == (voice, "audio/ogg")
    assert [r["path"] for r in fake.requests] == ["/v21.0/1013859600285442"]
    assert fake.unauthorized == []  # the Graph API had its token
    assert [seen.authorization for seen in elsewhere.requests] == [None]
