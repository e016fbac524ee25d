"""Sending WhatsApp replies with the real twilio client against a local Messages API."""

from __future__ import annotations

import base64
import logging
import re
import socket
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import pytest
from pytest_aiohttp import AiohttpServer

from channels.twilio_send import MAX_BODY_CHARS, TwilioSender
from core.delivery import DeliveryError, Template
from tests.fakes.twilio import FakeTwilio

TO = "whatsapp:+15551234567"
FROM = "whatsapp:+14155238886"
ORDER_UPDATE = Template(
    name="order_update",
    provider_id="HX" + "0123456789abcdef" * 2,
    language="en",
    text="Hi {{1}}, your order {{2}} has shipped.",
)


@pytest.fixture
def fake() -> FakeTwilio:
    return FakeTwilio()


@pytest.fixture
async def api_base(fake: FakeTwilio, aiohttp_server: AiohttpServer) -> str:
    server = await aiohttp_server(fake.app())
    return str(server.make_url("")).rstrip("/")


@pytest.fixture
async def sender(fake: FakeTwilio, api_base: str) -> AsyncIterator[TwilioSender]:
    sender = TwilioSender(
        fake.account_sid,
        fake.auth_token,
        FROM,
        api_base=api_base,
        status_callback="https://parley.example/webhooks/twilio/status",
        timeout=2.0,
    )
    yield sender
    await sender.close()


async def test_a_part_is_one_message_with_the_status_callback(
    sender: TwilioSender, fake: FakeTwilio
) -> None:
    sent = await sender.send(TO, "Your order ships tomorrow.")

    assert fake.bodies == ["Your order ships tomorrow."]
    assert sent.provider_message_id == fake.messages[0]["sid"]
    assert sent.provider_message_id.startswith("SM")
    assert (fake.messages[0]["to"], fake.messages[0]["from"]) == (TO, FROM)
    assert fake.messages[0]["status_callback"] == "https://parley.example/webhooks/twilio/status"


async def test_a_part_above_the_limit_is_refused_before_anything_is_sent(
    sender: TwilioSender, fake: FakeTwilio
) -> None:
    # Replies are cut once, by the channel, when queued: a longer part is a bug upstream.
    with pytest.raises(DeliveryError) as info:
        await sender.send(TO, "x" * (MAX_BODY_CHARS + 1))
    assert (info.value.code, info.value.permanent) == ("too_long", True)
    assert fake.requests == []


async def test_no_status_callback_is_sent_when_none_is_set(fake: FakeTwilio, api_base: str) -> None:
    sender = TwilioSender(fake.account_sid, fake.auth_token, FROM, api_base=api_base)
    try:
        await sender.send(TO, "hi")
    finally:
        await sender.close()
    assert "StatusCallback" not in fake.requests[0]["form"]


@pytest.mark.parametrize("code", [21617, 63016, 21211, 21614, 21610])
async def test_known_codes_are_permanent(sender: TwilioSender, fake: FakeTwilio, code: int) -> None:
    fake.fail_next = [(400, code)]

    with pytest.raises(DeliveryError) as info:
        await sender.send(TO, "hello")

    error = info.value
    assert error.code == str(code)
    assert error.permanent
    assert error.retry_after is None
    assert fake.requests[-1]["code"] == code
    assert fake.messages == []


async def test_wrong_credentials_are_permanent(fake: FakeTwilio, api_base: str) -> None:
    sender = TwilioSender(fake.account_sid, "not-the-token", FROM, api_base=api_base)
    try:
        with pytest.raises(DeliveryError) as info:
            await sender.send(TO, "hello")
    finally:
        await sender.close()
    assert (info.value.code, info.value.permanent) == ("20003", True)


@pytest.mark.parametrize(
    ("failure", "retry_after"),
    [
        ((429, None, "7"), 7.0),
        ((429, None), None),
        ((500, None), None),
        ((503, None, "2.5"), 2.5),
    ],
)
async def test_rate_limits_and_server_errors_are_transient(
    sender: TwilioSender,
    fake: FakeTwilio,
    failure: tuple[int, None] | tuple[int, None, str],
    retry_after: float | None,
) -> None:
    fake.fail_next = [failure]

    with pytest.raises(DeliveryError) as info:
        await sender.send(TO, "hello")

    assert not info.value.permanent
    assert not info.value.ambiguous  # Twilio answered: it accepted nothing
    assert info.value.retry_after == retry_after
    assert info.value.code == {429: "20429", 500: "20500", 503: "20500"}[failure[0]]
    # the next attempt goes through
    assert (await sender.send(TO, "hello")).provider_message_id.startswith("SM")


async def test_a_hanging_api_times_out_as_transient(fake: FakeTwilio, api_base: str) -> None:
    fake.hang = True
    sender = TwilioSender(fake.account_sid, fake.auth_token, FROM, api_base=api_base, timeout=0.3)
    try:
        with pytest.raises(DeliveryError) as info:
            await sender.send(TO, "hello")
    finally:
        await sender.close()
    assert (info.value.code, info.value.permanent) == ("timeout", False)
    assert info.value.ambiguous  # the request went out; Twilio may have it


async def test_an_answer_lost_after_acceptance_is_ambiguous_and_found(
    fake: FakeTwilio, api_base: str
) -> None:
    fake.answer_late_by = 3.0
    sender = TwilioSender(fake.account_sid, fake.auth_token, FROM, api_base=api_base, timeout=0.3)
    started = datetime.now(UTC)
    try:
        with pytest.raises(DeliveryError) as info:
            await sender.send(TO, "Your parcel left the warehouse today.")
        assert (info.value.code, info.value.ambiguous, info.value.permanent) == (
            "timeout",
            True,
            False,
        )
        [accepted] = fake.messages  # Twilio has it, though its answer never came

        found = await sender.find_sent(TO, "Your parcel left the warehouse today.", started)
        other_body = await sender.find_sent(TO, "Something else.", started)
        other_chat = await sender.find_sent("whatsapp:+15550000000", accepted["body"], started)
        later = await sender.find_sent(TO, accepted["body"], started + timedelta(minutes=5))
    finally:
        await sender.close()

    assert [s.provider_message_id for s in found] == [accepted["sid"]]
    assert (other_body, other_chat, later) == ([], [], [])
    query = fake.lists[0]
    assert (query["To"], query["From"]) == (TO, FROM)
    assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", query["DateSent>"])  # a day, as Twilio takes it
    assert len(fake.messages) == 1  # looking up sends nothing


async def test_a_look_up_pages_through_the_list(sender: TwilioSender, fake: FakeTwilio) -> None:
    started = datetime.now(UTC)
    await sender.send(TO, "The first answer.")
    for n in range(60):  # newer messages push the first one onto the second page
        await sender.send(TO, f"Answer {n}.")

    found = await sender.find_sent(TO, "The first answer.", started)

    assert [s.provider_message_id for s in found] == [fake.messages[0]["sid"]]
    assert [q.get("Page", "0") for q in fake.lists] == ["0", "1"]
    assert "PageToken" in fake.lists[1]


@pytest.mark.parametrize(("status", "permanent"), [(500, False), (429, False), (403, True)])
async def test_a_failed_look_up_says_so(
    sender: TwilioSender, fake: FakeTwilio, status: int, permanent: bool
) -> None:
    fake.fail_list_next = [(status, None)]
    with pytest.raises(DeliveryError) as info:
        await sender.find_sent(TO, "hello", datetime.now(UTC))
    assert (info.value.code, info.value.permanent) == (f"lookup_{status}", permanent)
    assert fake.messages == []


async def test_an_unreachable_api_is_transient(fake: FakeTwilio) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    sender = TwilioSender(
        fake.account_sid, fake.auth_token, FROM, api_base=f"http://127.0.0.1:{port}"
    )
    try:
        with pytest.raises(DeliveryError) as info:
            await sender.send(TO, "hello")
    finally:
        await sender.close()
    assert (info.value.code, info.value.permanent) == ("connection", False)
    assert not info.value.ambiguous  # no connection, no request: nothing can have arrived


async def test_the_auth_token_is_never_logged(
    sender: TwilioSender, fake: FakeTwilio, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    basic = base64.b64encode(f"{fake.account_sid}:{fake.auth_token}".encode()).decode()

    await sender.send(TO, "Your parcel left the warehouse today.")
    fake.fail_next = [(400, 21617)]
    with pytest.raises(DeliveryError) as info:
        await sender.send(TO, "hello")

    assert caplog.records, "the twilio client logs its requests at INFO"
    for secret in (fake.auth_token, basic):
        assert secret not in caplog.text
        assert secret not in str(info.value)
        assert secret not in repr(info.value)
        assert secret not in repr(sender)


# -- approved templates (outside WhatsApp's 24-hour window) -----------------------------------


async def test_a_template_is_its_content_sid_with_numbered_variables(
    sender: TwilioSender, fake: FakeTwilio
) -> None:
    sent = await sender.send_template(TO, ORDER_UPDATE, ["Zoë", "#1042"])

    [message] = fake.messages
    assert sent.provider_message_id == message["sid"]
    assert message["content_sid"] == ORDER_UPDATE.provider_id
    assert message["content_variables"] == {"1": "Zoë", "2": "#1042"}
    assert (message["to"], message["from"]) == (TO, FROM)
    assert message["status_callback"] == "https://parley.example/webhooks/twilio/status"
    form = fake.requests[0]["form"]
    assert "Body" not in form  # the text is Twilio's: the template as approved, filled in
    assert form["ContentVariables"] == '{"1": "Zoë", "2": "#1042"}'


async def test_a_template_without_placeholders_sends_no_values(
    sender: TwilioSender, fake: FakeTwilio
) -> None:
    hello = Template("hello", "HX" + "f" * 32, "en", "Hello! Can we help you further?")
    await sender.send_template(TO, hello, [])
    assert fake.messages[0]["content_variables"] == {}


async def test_outside_the_window_free_text_fails_for_good_and_a_template_goes_out(
    sender: TwilioSender, fake: FakeTwilio
) -> None:
    fake.window_closed = True

    with pytest.raises(DeliveryError) as info:
        await sender.send(TO, "Are you still there?")
    assert (info.value.code, info.value.permanent) == ("63016", True)
    assert fake.messages == []

    await sender.send_template(TO, ORDER_UPDATE, ["Sam", "#7"])
    assert [m["content_sid"] for m in fake.messages] == [ORDER_UPDATE.provider_id]


async def test_a_template_refused_or_unanswered_is_classified_like_a_part(
    fake: FakeTwilio, api_base: str
) -> None:
    sender = TwilioSender(fake.account_sid, fake.auth_token, FROM, api_base=api_base, timeout=0.3)
    unknown = Template("gone", "HX-not-a-content-sid", "en", "Hi {{1}}")
    try:
        with pytest.raises(DeliveryError) as refused:
            await sender.send_template(TO, unknown, ["Sam"])
        fake.fail_next = [(429, None, "4")]
        with pytest.raises(DeliveryError) as throttled:
            await sender.send_template(TO, ORDER_UPDATE, ["Sam", "#7"])
        fake.hang = True
        with pytest.raises(DeliveryError) as silent:
            await sender.send_template(TO, ORDER_UPDATE, ["Sam", "#7"])
    finally:
        await sender.close()
    assert (refused.value.code, refused.value.permanent) == ("21655", True)
    assert (throttled.value.permanent, throttled.value.retry_after) == (False, 4.0)
    assert (silent.value.code, silent.value.ambiguous) == ("timeout", True)
    assert fake.messages == []
