"""Voice notes and pictures on the messaging channels, through the inbox worker to the reply.

A voice note is downloaded with the channel's own credentials (Telegram's getFile, Twilio's
media URL with Basic auth), transcribed by the OpenAI-compatible fake, and answered like
text; staff see the transcript in the turn's trace. Without a transcription model, or for a
picture without a caption, the customer is told in their language what to do instead.
Downloads go through the outbound guard: a media URL leading to a private address, or to a
page instead of audio, gets "please type" too, and staff cannot fetch it either.
"""

from __future__ import annotations

import base64
import re
from collections.abc import AsyncIterator
from ipaddress import ip_network
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from core.answer.phrases import phrase
from core.settings import Settings
from core.store import Agents
from core.store.staff import StaffAccounts
from gateway.app import create_app
from gateway.voice import VoiceNotes, open_voice_notes
from tests.conftest import MakeSettings
from tests.fakes.media import FakeMediaHost, MediaFile
from tests.fakes.openai import FakeOpenAI, audio_key
from tests.integration.test_inbox_worker import WHATSAPP_FROM, Rig, Running, rig, running
from tests.support.console import sign_in
from tests.support.deliveries import add_delivery
from tests.support.waiting import wait_until

__all__ = ["rig", "running"]  # the fixtures, shared with the inbox worker's tests

VOICE = b"OggS\x00\x02" + bytes(range(200))  # what the customer recorded
QUESTION = "How long does delivery to Belgium take?"
CUSTOMER = "whatsapp:+31611122233"
ADMIN_TOKEN = "admin-token-for-voice-note-tests-0123456789"


@pytest.fixture
async def openai_fake() -> AsyncIterator[tuple[FakeOpenAI, str]]:
    fake = FakeOpenAI(transcripts={audio_key(VOICE): QUESTION})
    server = TestServer(fake.app())
    await server.start_server()
    yield fake, str(server.make_url("/v1"))
    await server.close()


def _voice_settings(
    rig: Rig, make_settings: MakeSettings, openai_url: str | None, **more: Any
) -> Settings:
    """The gateway's settings: the environment's Telegram bot (and Twilio account), and a
    transcription model at the fake OpenAI when ``openai_url`` is given."""
    values: dict[str, Any] = {
        "telegram_bot_token": rig.telegram.token,
        "telegram_api_base": rig.senders["telegram"]._api_base,
        **more,
    }
    if openai_url is not None:
        values |= {
            "llm_base_url": openai_url,
            "llm_api_key": "sk-test",
            "transcribe_model": "whisper-1",
        }
    return make_settings(**values)


def _telegram_voice(update_id: int, chat: int, language: str = "en") -> dict[str, Any]:
    return {
        "update_id": update_id,
        "message": {
            "message_id": update_id, "date": 1700000000,
            "chat": {"id": chat, "type": "private", "first_name": "Ann"},
            "from": {"id": chat, "is_bot": False, "first_name": "Ann", "last_name": "Smit",
                     "username": "annsmit", "language_code": language},
            "voice": {"file_id": "AwACvoice", "file_unique_id": "AgADv", "duration": 3,
                      "mime_type": "audio/ogg", "file_size": len(VOICE)},
        },
    }  # fmt: skip


async def _voice_notes(rig: Rig, settings: Settings) -> AsyncIterator[VoiceNotes]:
    voice = open_voice_notes(settings, Agents(rig.database.pool))
    try:
        yield voice
    finally:
        await voice.close()


async def _trace(rig: Rig, chat: str) -> tuple[str, dict[str, Any]]:
    row = await rig.database.pool.fetchrow(
        """SELECT m.text, t.trace FROM turns t
             JOIN conversations c ON c.id = t.conversation_id
             JOIN messages m ON m.conversation_id = c.id AND m.role = 'visitor'
            WHERE c.conversation_key = $1 ORDER BY t.id DESC, m.id DESC LIMIT 1""",
        chat,
    )
    assert row is not None
    return row["text"], dict(row["trace"])


async def test_a_telegram_voice_note_is_transcribed_and_answered(
    rig: Rig, running: Running, make_settings: MakeSettings, openai_fake: tuple[FakeOpenAI, str]
) -> None:
    fake, url = openai_fake
    rig.telegram.files["AwACvoice"] = (VOICE, "voice/file_7.oga")
    assert await add_delivery(
        rig.inbox, rig.agent.id, "telegram", "9001", "601", _telegram_voice(9001, 601)
    )
    async for voice in _voice_notes(rig, _voice_settings(rig, make_settings, url)):
        assert await rig.worker(burst_window=0.0, transcripts=voice).process_next()
    running.start(rig.sender().run())

    await wait_until(rig.outbox_settled)
    [reply] = [m["text"] for m in rig.telegram.messages if m["chat_id"] == 601]
    assert "2-3 working days" in reply
    assert rig.telegram.downloads == ["voice/file_7.oga"]
    [upload] = fake.transcription_requests
    assert (upload["model"], upload["sha256"]) == ("whisper-1", audio_key(VOICE))
    # Staff read what was heard, beside the voice note it came from.
    question, trace = await _trace(rig, "601")
    assert question == QUESTION
    assert trace["voice"] == [{"media": "AwACvoice", "transcript": QUESTION}]
    # ... and see who wrote: the name and handle Telegram gave.
    name = await rig.database.pool.fetchrow(
        "SELECT customer_name, customer_handle FROM conversations WHERE conversation_key = '601'"
    )
    assert (name["customer_name"], name["customer_handle"]) == ("Ann Smit", "annsmit")


async def test_a_whatsapp_voice_note_is_fetched_with_the_accounts_basic_auth(
    rig: Rig, running: Running, make_settings: MakeSettings, openai_fake: tuple[FakeOpenAI, str]
) -> None:
    fake, url = openai_fake
    sid, token = rig.twilio.account_sid, rig.twilio.auth_token
    basic = "Basic " + base64.b64encode(f"{sid}:{token}".encode()).decode()
    host = FakeMediaHost(files={"/media/ME1": MediaFile(VOICE, "audio/ogg")}, authorization=basic)
    server = TestServer(host.app())
    await server.start_server()
    payload = {
        "MessageSid": "SM" + "4" * 32, "From": CUSTOMER, "To": WHATSAPP_FROM, "Body": "",
        "NumMedia": "1", "MediaUrl0": str(server.make_url("/media/ME1")),
        "MediaContentType0": "audio/ogg", "ProfileName": "Joost",
    }  # fmt: skip
    assert await add_delivery(
        rig.inbox, rig.agent.id, "whatsapp", payload["MessageSid"], CUSTOMER, payload
    )
    # The fake stands in for Twilio's API, and media downloads may reach it: both said here.
    voice_settings = _voice_settings(
        rig,
        make_settings,
        url,
        twilio_account_sid=sid,
        twilio_auth_token=token,
        twilio_api_base=str(server.make_url("")).rstrip("/"),
        media_allow_networks=[ip_network("127.0.0.1/32")],
    )
    try:
        async for voice in _voice_notes(rig, voice_settings):
            assert await rig.worker(burst_window=0.0, transcripts=voice).process_next()
    finally:
        await server.close()
    running.start(rig.sender().run())

    await wait_until(rig.outbox_settled)
    [reply] = rig.twilio.bodies
    assert "2-3 working days" in reply
    assert [seen.authorization for seen in host.requests] == [basic]
    assert fake.transcription_requests[0]["sha256"] == audio_key(VOICE)


@pytest.mark.parametrize("language", ["nl", "de"])
async def test_without_a_transcription_model_the_customer_is_asked_to_type(
    rig: Rig, running: Running, make_settings: MakeSettings, language: str
) -> None:
    rig.telegram.files["AwACvoice"] = (VOICE, "voice/file_7.oga")
    update = _telegram_voice(9002, 602, language)
    assert await add_delivery(rig.inbox, rig.agent.id, "telegram", "9002", "602", update)
    async for voice in _voice_notes(rig, _voice_settings(rig, make_settings, None)):
        assert not voice.available
        assert await rig.worker(burst_window=0.0, transcripts=voice).process_next()
    running.start(rig.sender().run())

    await wait_until(rig.outbox_settled)
    assert [m["text"] for m in rig.telegram.messages] == [phrase("type_please", language)]
    assert rig.telegram.downloads == []  # nothing fetched that nobody can listen to


async def test_a_failed_transcription_is_tried_again_not_answered_wrongly(
    rig: Rig, make_settings: MakeSettings, openai_fake: tuple[FakeOpenAI, str]
) -> None:
    fake, url = openai_fake
    fake.transcription_failures = [503]
    rig.telegram.files["AwACvoice"] = (VOICE, "voice/file_7.oga")
    assert await add_delivery(
        rig.inbox, rig.agent.id, "telegram", "9003", "603", _telegram_voice(9003, 603)
    )
    async for voice in _voice_notes(rig, _voice_settings(rig, make_settings, url)):
        assert await rig.worker(burst_window=0.0, transcripts=voice).process_next()
    row = await rig.database.pool.fetchrow("SELECT status, attempts, error FROM inbox")
    assert (row["status"], row["attempts"]) == ("pending", 1)
    assert "transcription failed" in row["error"]
    assert await rig.outbox.rows(rig.agent.id) == []


async def test_a_picture_is_answered_from_its_caption_or_told_text_only(
    rig: Rig, running: Running
) -> None:
    picture = {"NumMedia": "1", "MediaUrl0": "https://api.twilio.com/media/ME2",
               "MediaContentType0": "image/jpeg", "To": WHATSAPP_FROM}  # fmt: skip
    captioned = {"MessageSid": "SM" + "5" * 32, "From": CUSTOMER, "Body": QUESTION, **picture}
    bare = {"MessageSid": "SM" + "6" * 32, "From": "whatsapp:+4915112345678", "Body": "", **picture}
    for payload in (captioned, bare):
        assert await add_delivery(
            rig.inbox, rig.agent.id, "whatsapp", payload["MessageSid"], payload["From"], payload
        )
    # The second customer writes German: told in German that the assistant reads text only.
    await rig.database.pool.execute(
        """INSERT INTO conversations (agent_id, channel, conversation_key, language)
           VALUES ($1, 'whatsapp', $2, 'de')""",
        rig.agent.id,
        bare["From"],
    )
    running.start(rig.worker(burst_window=0.0).run())
    running.start(rig.sender().run())

    await wait_until(rig.all_done)
    await wait_until(rig.outbox_settled)
    by_customer = {m["to"]: m["body"] for m in rig.twilio.messages}
    assert "2-3 working days" in by_customer[CUSTOMER]
    assert by_customer[bare["From"]] == phrase("text_only", "de")
    assert len(rig.twilio.messages) == 2  # each answered once


async def test_a_voice_note_gone_from_the_provider_gets_please_type(
    rig: Rig, running: Running, make_settings: MakeSettings, openai_fake: tuple[FakeOpenAI, str]
) -> None:
    fake, url = openai_fake
    # Telegram no longer has the file (getFile fails): no retry can hear it.
    update = _telegram_voice(9004, 604, "nl")
    assert await add_delivery(rig.inbox, rig.agent.id, "telegram", "9004", "604", update)
    async for voice in _voice_notes(rig, _voice_settings(rig, make_settings, url)):
        assert await rig.worker(burst_window=0.0, transcripts=voice).process_next()
    running.start(rig.sender().run())

    await wait_until(rig.outbox_settled)
    assert [m["text"] for m in rig.telegram.messages] == [phrase("type_please", "nl")]
    assert fake.transcription_requests == []


async def test_staff_listen_to_the_voice_note_beside_its_transcript(
    rig: Rig, make_settings: MakeSettings, openai_fake: tuple[FakeOpenAI, str]
) -> None:
    _, url = openai_fake
    rig.telegram.files["AwACvoice"] = (VOICE, "voice/file_7.oga")
    update = _telegram_voice(9005, 605)
    assert await add_delivery(rig.inbox, rig.agent.id, "telegram", "9005", "605", update)
    settings = _voice_settings(rig, make_settings, url, admin_token=ADMIN_TOKEN)
    async for voice in _voice_notes(rig, settings):
        assert await rig.worker(burst_window=0.0, transcripts=voice).process_next()
    conversation = await rig.database.pool.fetchval(
        "SELECT id FROM conversations WHERE conversation_key = '605'"
    )
    client = TestClient(TestServer(create_app(settings)))
    await client.start_server()
    try:
        assert (await sign_in(client, token=ADMIN_TOKEN)).status == 303
        page = await client.get(f"/admin/conversations/{conversation}")
        html = await page.text()
        assert page.status == 200
        assert QUESTION in html
        assert "Ann Smit" in html  # the customer's name, not the chat id
        [source] = re.findall(r'<audio controls preload="none" src="([^"]+)"', html)
        listened = await client.get(f"/admin/conversations/{source}")
        assert listened.status == 200
        assert listened.content_type == "audio/ogg"
        assert await listened.read() == VOICE
        assert listened.headers["Cache-Control"] == "private, no-store"
        # A note the conversation does not have is a 404, not another conversation's.
        missing = await client.get(f"/admin/conversations/{conversation}/voice/999999/0")
        assert missing.status == 404
    finally:
        await client.close()
    # Telegram served the file twice: to the transcription, and to staff.
    assert rig.telegram.downloads == ["voice/file_7.oga", "voice/file_7.oga"]


# -- downloads through the outbound guard ----------------------------------------------------

# The fake hosts listen on loopback; each test lets media downloads reach exactly the ones it
# names (PARLEY_MEDIA_ALLOW_NETWORKS), never more.
OUTSIDE = ip_network("127.0.0.2/32")
MEDIA_PATH = "/2010-04-01/Accounts/AC0/Messages/MM0/Media/ME1"
STAFF_EMAIL = "sam@shop.example"
STAFF_PASSWORD = "correct horse battery staple"


async def _host(host: FakeMediaHost, address: str = "127.0.0.1") -> TestServer:
    server = TestServer(host.app(), host=address)
    await server.start_server()
    return server


def _basic(rig: Rig) -> str:
    sid, token = rig.twilio.account_sid, rig.twilio.auth_token
    return "Basic " + base64.b64encode(f"{sid}:{token}".encode()).decode()


async def _whatsapp_voice_note(rig: Rig, url: str, sid: str, language: str | None = None) -> None:
    payload = {
        "MessageSid": sid, "From": CUSTOMER, "To": WHATSAPP_FROM, "Body": "",
        "NumMedia": "1", "MediaUrl0": url, "MediaContentType0": "audio/ogg",
    }  # fmt: skip
    assert await add_delivery(rig.inbox, rig.agent.id, "whatsapp", sid, CUSTOMER, payload)
    if language is not None:
        await rig.database.pool.execute(
            """INSERT INTO conversations (agent_id, channel, conversation_key, language)
               VALUES ($1, 'whatsapp', $2, $3)""",
            rig.agent.id,
            CUSTOMER,
            language,
        )


def _twilio_settings(
    rig: Rig, make_settings: MakeSettings, openai_url: str, **more: Any
) -> Settings:
    return _voice_settings(
        rig,
        make_settings,
        openai_url,
        twilio_account_sid=rig.twilio.account_sid,
        twilio_auth_token=rig.twilio.auth_token,
        **more,
    )


async def _answer_one(rig: Rig, settings: Settings) -> None:
    async for voice in _voice_notes(rig, settings):
        assert await rig.worker(burst_window=0.0, transcripts=voice).process_next()


async def test_a_media_url_off_twilio_gets_no_credentials_and_its_redirect_inward_is_refused(
    rig: Rig, running: Running, make_settings: MakeSettings, openai_fake: tuple[FakeOpenAI, str]
) -> None:
    """A MediaUrl0 on a host that is not Twilio's, sending the download on to the machine
    itself (where it would find a voice note): the customer is asked to type, in German."""
    fake, url = openai_fake
    internal = FakeMediaHost(files={"/secret": MediaFile(VOICE, "audio/ogg")})
    internal_server = await _host(internal)
    outside = FakeMediaHost(redirects={MEDIA_PATH: str(internal_server.make_url("/secret"))})
    outside_server = await _host(outside, "127.0.0.2")
    await _whatsapp_voice_note(rig, str(outside_server.make_url(MEDIA_PATH)), "SM" + "7" * 32, "de")
    # Twilio's API is api.twilio.com (the default): the outside host is not the provider's.
    settings = _twilio_settings(rig, make_settings, url, media_allow_networks=[OUTSIDE])
    try:
        await _answer_one(rig, settings)
    finally:
        await outside_server.close()
        await internal_server.close()
    running.start(rig.sender().run())

    await wait_until(rig.outbox_settled)
    assert rig.twilio.bodies == [phrase("type_please", "de")]
    assert [seen.authorization for seen in outside.requests] == [None]
    assert internal.requests == []
    assert fake.transcription_requests == []
    question, trace = await _trace(rig, CUSTOMER)
    assert question == "[voice]"
    assert "voice" not in trace  # nothing staff could fetch again
    assert await rig.statuses() == ["done"]


@pytest.mark.parametrize("listed", [True, False], ids=["listed", "not-listed"])
async def test_the_providers_local_fake_is_reached_only_when_listed(
    rig: Rig,
    running: Running,
    make_settings: MakeSettings,
    openai_fake: tuple[FakeOpenAI, str],
    listed: bool,
) -> None:
    """PARLEY_TWILIO_API_BASE at a fake on 127.0.0.1 makes it Twilio's host (it gets the
    credentials), but the guard lets media through to it only when the media allow-list
    names it: the crawler's allow-list (loopback, in every test) does not count."""
    fake, url = openai_fake
    host = FakeMediaHost(
        files={MEDIA_PATH: MediaFile(VOICE, "audio/ogg")}, authorization=_basic(rig)
    )
    server = await _host(host)
    await _whatsapp_voice_note(rig, str(server.make_url(MEDIA_PATH)), "SM" + "8" * 32)
    allowed = [ip_network("127.0.0.1/32")] if listed else []
    settings = _twilio_settings(
        rig,
        make_settings,
        url,
        twilio_api_base=str(server.make_url("")).rstrip("/"),
        media_allow_networks=allowed,
    )
    assert settings.crawl_allow_networks  # loopback, for the crawler only
    try:
        await _answer_one(rig, settings)
    finally:
        await server.close()
    running.start(rig.sender().run())

    await wait_until(rig.outbox_settled)
    [reply] = rig.twilio.bodies
    if listed:
        assert "2-3 working days" in reply
        assert [seen.authorization for seen in host.requests] == [_basic(rig)]
        assert fake.transcription_requests[0]["sha256"] == audio_key(VOICE)
    else:
        assert reply == phrase("type_please", "en")
        assert host.requests == []
        assert fake.transcription_requests == []


async def test_a_voice_note_that_is_no_audio_is_neither_transcribed_nor_kept(
    rig: Rig, running: Running, make_settings: MakeSettings, openai_fake: tuple[FakeOpenAI, str]
) -> None:
    fake, url = openai_fake
    page = MediaFile(b"<html><h1>Router admin</h1>password: hunter2</html>", "text/html")
    host = FakeMediaHost(files={MEDIA_PATH: page}, authorization=_basic(rig))
    server = await _host(host)
    await _whatsapp_voice_note(rig, str(server.make_url(MEDIA_PATH)), "SM" + "9" * 32, "nl")
    settings = _twilio_settings(
        rig,
        make_settings,
        url,
        twilio_api_base=str(server.make_url("")).rstrip("/"),
        media_allow_networks=[ip_network("127.0.0.1/32")],
    )
    try:
        await _answer_one(rig, settings)
    finally:
        await server.close()
    running.start(rig.sender().run())

    await wait_until(rig.outbox_settled)
    assert rig.twilio.bodies == [phrase("type_please", "nl")]
    assert fake.transcription_requests == []
    _, trace = await _trace(rig, CUSTOMER)
    assert "voice" not in trace


async def test_staff_cannot_fetch_internal_content_through_a_voice_note(
    rig: Rig, make_settings: MakeSettings, openai_fake: tuple[FakeOpenAI, str]
) -> None:
    """A voice note heard from the provider, whose URL later sends elsewhere: an agent who
    listens to it gets neither what the machine itself serves nor a page instead of audio."""
    _, url = openai_fake
    internal = FakeMediaHost(files={"/secret": MediaFile(b"internal secret", "audio/ogg")})
    internal_server = await _host(internal)
    provider = FakeMediaHost(
        files={MEDIA_PATH: MediaFile(VOICE, "audio/ogg")}, authorization=_basic(rig)
    )
    provider_server = await _host(provider, "127.0.0.2")
    await _whatsapp_voice_note(rig, str(provider_server.make_url(MEDIA_PATH)), "SM" + "1" * 32)
    settings = _twilio_settings(
        rig,
        make_settings,
        url,
        admin_token=ADMIN_TOKEN,
        twilio_api_base=str(provider_server.make_url("")).rstrip("/"),
        media_allow_networks=[OUTSIDE],
    )
    await StaffAccounts(rig.database.pool).create(STAFF_EMAIL, STAFF_PASSWORD, role="agent")
    client = TestClient(TestServer(create_app(settings)))
    try:
        await _answer_one(rig, settings)
        _, trace = await _trace(rig, CUSTOMER)
        assert trace["voice"][0]["transcript"] == QUESTION
        conversation = await rig.database.pool.fetchval(
            "SELECT id FROM conversations WHERE conversation_key = $1", CUSTOMER
        )
        await client.start_server()
        signed_in = await sign_in(client, email=STAFF_EMAIL, password=STAFF_PASSWORD)
        assert signed_in.status == 303
        html = await (await client.get(f"/admin/conversations/{conversation}")).text()
        [source] = re.findall(r'<audio controls preload="none" src="([^"]+)"', html)
        listened = await client.get(f"/admin/conversations/{source}")
        assert (listened.status, await listened.read()) == (200, VOICE)

        # The provider's URL now sends the download to the machine itself...
        del provider.files[MEDIA_PATH]
        provider.redirects[MEDIA_PATH] = str(internal_server.make_url("/secret"))
        inward = await client.get(f"/admin/conversations/{source}")
        assert inward.status == 404
        assert b"internal secret" not in await inward.read()
        assert internal.requests == []
        # ... or answers with a page instead of audio.
        del provider.redirects[MEDIA_PATH]
        provider.files[MEDIA_PATH] = MediaFile(b"<html>hunter2</html>", "text/html")
        page = await client.get(f"/admin/conversations/{source}")
        assert page.status == 404
        assert b"hunter2" not in await page.read()
    finally:
        await client.close()
        await provider_server.close()
        await internal_server.close()
