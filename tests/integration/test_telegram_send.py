"""Sending Telegram replies with the real python-telegram-bot against a local Bot API."""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest
from pydantic import ValidationError
from pytest_aiohttp import AiohttpServer

from channels.citations import reply_parts
from channels.telegram_send import MAX_TEXT_CHARS, SEND_TIMEOUT, SERVER_WAIT, TelegramSender
from core.delivery import DeliveryError
from core.settings import Settings
from tests.fakes.telegram import BLOCKED, CANT_PARSE, FakeTelegram, flood

CHAT = 4242


@pytest.fixture
def fake() -> FakeTelegram:
    return FakeTelegram()


@pytest.fixture
async def api_base(fake: FakeTelegram, aiohttp_server: AiohttpServer) -> str:
    server = await aiohttp_server(fake.app())
    return str(server.make_url("")).rstrip("/")


@pytest.fixture
async def sender(fake: FakeTelegram, api_base: str) -> AsyncIterator[TelegramSender]:
    sender = TelegramSender(fake.token, api_base=api_base, timeout=5.0, typing_interval=0.05)
    await sender.start()
    yield sender
    await sender.close()


async def test_start_checks_the_token(sender: TelegramSender, fake: FakeTelegram) -> None:
    assert [call["method"] for call in fake.calls] == ["getMe"]


async def test_a_wrong_token_is_permanent_and_not_quoted(fake: FakeTelegram, api_base: str) -> None:
    wrong = "987654321:AAWrongTokenWrongTokenWrongToken_00"
    sender = TelegramSender(wrong, api_base=api_base)
    try:
        with pytest.raises(DeliveryError) as info:
            await sender.start()
    finally:
        await sender.close()
    assert (info.value.code, info.value.permanent) == ("invalid_token", True)
    assert wrong not in str(info.value)
    assert info.value.__suppress_context__


async def test_a_part_is_one_message_in_html(sender: TelegramSender, fake: FakeTelegram) -> None:
    sent = await sender.send(str(CHAT), "Your order ships tomorrow.")

    [message] = fake.messages
    assert sent.provider_message_id == str(message["message_id"])
    assert (message["chat_id"], message["parse_mode"]) == (CHAT, "HTML")


async def test_a_part_above_the_limit_is_refused_before_anything_is_sent(
    sender: TelegramSender, fake: FakeTelegram
) -> None:
    # Replies are cut once, by the channel, when queued: a longer part is a bug upstream.
    with pytest.raises(DeliveryError) as info:
        await sender.send(str(CHAT), "x" * (MAX_TEXT_CHARS + 1))
    assert (info.value.code, info.value.permanent) == ("too_long", True)
    assert fake.messages == []


async def test_text_is_html_escaped(sender: TelegramSender, fake: FakeTelegram) -> None:
    text = "Use <b>bold</b> & 5 > 3, not &amp; or <script>"

    await sender.send(str(CHAT), text)

    [message] = fake.messages
    assert message["parse_mode"] == "HTML"
    assert message["sent"] == (
        "Use &lt;b&gt;bold&lt;/b&gt; &amp; 5 &gt; 3, not &amp;amp; or &lt;script&gt;"
    )
    assert message["text"] == text  # what the user sees


@dataclass(frozen=True)
class Cited:
    id: int
    url: str
    title: str


async def test_cited_sources_arrive_as_links_after_the_escaped_answer(
    sender: TelegramSender, fake: FakeTelegram
) -> None:
    sources = [
        Cited(1, "/en/sizes.html", "Sizes <EU> & UK"),
        Cited(2, "https://shop.example/en/returns?from=chat&lang=en", "Returns"),
    ]
    parts = reply_parts(
        "Sizes run <small> [1] & returns are free [2].",
        sender.limit,
        sources,
        language="en",
        site="https://shop.example",
    )

    for part in parts:
        await sender.send(str(CHAT), part)

    [message] = fake.messages
    assert message["parse_mode"] == "HTML"
    assert message["sent"] == (
        "Sizes run &lt;small&gt; [1] &amp; returns are free [2].\n\n"
        "Sources:\n"
        '[1] <a href="https://shop.example/en/sizes.html">Sizes &lt;EU&gt; &amp; UK</a>\n'
        '[2] <a href="https://shop.example/en/returns?from=chat&amp;lang=en">Returns</a>'
    )
    assert message["text"] == (
        "Sizes run <small> [1] & returns are free [2].\n\n"
        "Sources:\n[1] Sizes <EU> & UK\n[2] Returns"
    )


async def test_a_refused_list_falls_back_to_plain_text_with_its_urls(
    sender: TelegramSender, fake: FakeTelegram
) -> None:
    fake.fail_next = [CANT_PARSE]
    [part] = reply_parts(
        "Free returns [1].", sender.limit, [Cited(1, "https://shop.example/r", "Returns")]
    )

    await sender.send(str(CHAT), part)

    [message] = fake.messages
    assert message["parse_mode"] is None
    assert message["text"] == "Free returns [1].\n\nSources:\n[1] Returns – https://shop.example/r"


async def test_cant_parse_entities_falls_back_to_plain_text(
    sender: TelegramSender, fake: FakeTelegram, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="channels.telegram_send")
    fake.fail_next = [CANT_PARSE]

    sent = await sender.send(str(CHAT), "Tom & Jerry <3")

    assert sent.provider_message_id == str(fake.messages[0]["message_id"])
    sends = [c["params"] for c in fake.calls if c["method"] == "sendMessage"]
    assert [p.get("parse_mode") for p in sends] == ["HTML", None]
    assert sends[1]["text"] == "Tom & Jerry <3"
    assert fake.messages[0]["text"] == "Tom & Jerry <3"
    assert "telegram.send.plain_fallback" in caplog.messages


async def test_a_blocked_bot_is_permanent(sender: TelegramSender, fake: FakeTelegram) -> None:
    fake.blocked = {CHAT}

    with pytest.raises(DeliveryError) as info:
        await sender.send(str(CHAT), "hello")

    assert (info.value.code, info.value.permanent) == ("forbidden", True)
    assert "blocked by the user" in str(info.value)


async def test_other_bad_requests_are_permanent(sender: TelegramSender, fake: FakeTelegram) -> None:
    fake.fail_next = [(400, "Bad Request: chat not found")]

    with pytest.raises(DeliveryError) as info:
        await sender.send(str(CHAT), "hello")

    assert (info.value.code, info.value.permanent) == ("bad_request", True)
    assert "chat not found" in str(info.value).lower()


@pytest.mark.parametrize(
    "timedelta_mode",
    [
        pytest.param(
            False,
            marks=pytest.mark.filterwarnings("ignore:.*attribute `retry_after`"),
            id="ptb-default",
        ),
        pytest.param(True, id="PTB_TIMEDELTA"),
    ],
)
async def test_flood_control_is_transient_with_retry_after(
    sender: TelegramSender,
    fake: FakeTelegram,
    monkeypatch: pytest.MonkeyPatch,
    timedelta_mode: bool,
) -> None:
    if timedelta_mode:
        monkeypatch.setenv("PTB_TIMEDELTA", "true")
    else:
        monkeypatch.delenv("PTB_TIMEDELTA", raising=False)
    fake.fail_next = [flood(5)]

    with pytest.raises(DeliveryError) as info:
        await sender.send(str(CHAT), "hello")

    assert info.value.permanent is False
    assert info.value.retry_after == 5.0
    assert info.value.code == "rate_limited"


async def test_server_errors_are_transient(sender: TelegramSender, fake: FakeTelegram) -> None:
    fake.fail_next = [(502, "Bad Gateway")]

    with pytest.raises(DeliveryError) as info:
        await sender.send(str(CHAT), "hello")

    assert (info.value.code, info.value.permanent, info.value.retry_after) == (
        "network",
        False,
        None,
    )
    # a gateway error from Telegram's front end: the Bot API server behind it may have sent it
    assert info.value.ambiguous
    sent = await sender.send(str(CHAT), "hello")  # the next attempt goes through
    assert sent.provider_message_id == str(fake.messages[-1]["message_id"])


def test_the_send_timeout_outlasts_telegrams_own_waiting() -> None:
    """The Bot API server waits out flood control for up to SERVER_WAIT seconds before it
    answers; giving up sooner would turn a delivered message into a retried one."""
    assert SEND_TIMEOUT > SERVER_WAIT
    settings = Settings(_env_file=None)  # type: ignore[call-arg]
    assert settings.telegram_send_timeout_seconds > SERVER_WAIT
    with pytest.raises(ValidationError):
        Settings(_env_file=None, telegram_send_timeout_seconds=SERVER_WAIT)  # type: ignore[call-arg]


async def test_the_client_library_waits_as_long_as_the_send_timeout(
    fake: FakeTelegram, api_base: str
) -> None:
    # python-telegram-bot's own read timeout (5 s by default) would end the wait first.
    sender = TelegramSender(fake.token, api_base=api_base, timeout=SEND_TIMEOUT)
    try:
        bot = await sender.start()
        assert bot.request.read_timeout == SEND_TIMEOUT
    finally:
        await sender.close()


async def test_an_answer_lost_after_telegram_took_the_message_is_ambiguous(
    fake: FakeTelegram, api_base: str
) -> None:
    fake.answer_late_by = 3.0
    sender = TelegramSender(fake.token, api_base=api_base, timeout=0.3)
    try:
        with pytest.raises(DeliveryError) as info:
            await sender.send(str(CHAT), "hello")
    finally:
        await sender.close()
    assert (info.value.code, info.value.permanent, info.value.ambiguous) == ("timeout", False, True)
    assert fake.texts == ["hello"]


async def test_an_unreachable_bot_api_is_not_ambiguous(fake: FakeTelegram) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    sender = TelegramSender(fake.token, api_base=f"http://127.0.0.1:{port}", timeout=2.0)
    try:
        with pytest.raises(DeliveryError) as info:
            await sender.send(str(CHAT), "hello")
    finally:
        await sender.close()
    assert (info.value.code, info.value.permanent, info.value.ambiguous) == (
        "network",
        False,
        False,
    )


async def test_typing_sends_the_typing_action(sender: TelegramSender, fake: FakeTelegram) -> None:
    await sender.typing(CHAT)
    [call] = [c for c in fake.calls if c["method"] == "sendChatAction"]
    assert call["params"]["action"] == "typing"
    assert int(call["params"]["chat_id"]) == CHAT


async def test_typing_repeats_until_stopped(sender: TelegramSender, fake: FakeTelegram) -> None:
    stop = asyncio.Event()
    typing = asyncio.create_task(sender.keep_typing(str(CHAT), None, stop))

    await asyncio.wait_for(fake.wait_for("sendChatAction", 3), 5)
    stop.set()
    await asyncio.wait_for(typing, 1)  # returns at once, not after the next beat

    beats = fake.count("sendChatAction")
    await asyncio.sleep(0.15)  # three intervals: a leftover loop would have beaten again
    assert fake.count("sendChatAction") == beats


async def test_typing_survives_a_transient_failure(
    sender: TelegramSender, fake: FakeTelegram
) -> None:
    fake.action_fail_next = [(502, "Bad Gateway")]
    stop = asyncio.Event()
    typing = asyncio.create_task(sender.keep_typing(str(CHAT), None, stop))

    await asyncio.wait_for(fake.wait_for("sendChatAction", 3), 5)
    stop.set()
    await asyncio.wait_for(typing, 1)


async def test_typing_stops_by_itself_when_the_bot_is_blocked(
    sender: TelegramSender, fake: FakeTelegram
) -> None:
    fake.blocked = {CHAT}
    await asyncio.wait_for(sender.keep_typing(str(CHAT), None, asyncio.Event()), 2)
    assert fake.count("sendChatAction") == 1


async def test_the_token_is_never_logged(
    fake: FakeTelegram, api_base: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    sender = TelegramSender(fake.token, api_base=api_base)
    try:
        await sender.start()
        await sender.send(str(CHAT), "Your parcel left the warehouse today.")
        fake.fail_next = [BLOCKED]
        with pytest.raises(DeliveryError) as info:
            await sender.send(str(CHAT), "hello")
    finally:
        await sender.close()

    # The fake's own access log stands in for Telegram's servers, which do see the token.
    ours = [r.getMessage() for r in caplog.records if r.name != "aiohttp.access"]
    assert any(r.name == "httpx" for r in caplog.records), "httpx logs each request at INFO"
    assert any("<token>" in message for message in ours)
    assert not [message for message in ours if fake.token in message]
    assert fake.token not in str(info.value)
    assert fake.token not in repr(sender)
