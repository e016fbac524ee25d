"""Voice notes' building blocks for real: downloads from local file hosts over aiohttp, and
transcription by the openai client against the local fake OpenAI server."""

from __future__ import annotations

import ipaddress
import ssl
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from core.errors import ConfigError, MediaUnavailable, ModelFailed
from core.knowledge.outbound import crawler_session
from core.media import MAX_REDIRECTS, fetch_media, media_session
from core.settings import Settings
from core.transcribe import OpenAITranscriber, audio_filename, open_transcriber
from tests.fakes.media import FakeMediaHost, MediaFile
from tests.fakes.openai import FakeOpenAI, audio_key
from tests.support.services import LOOPBACK, free_port

KEY = "sk-test-0123456789abcdef"
# The start of an Ogg page, then filler: what a WhatsApp voice note looks like to us.
VOICE_NOTE = b"OggS\x00\x02" + bytes(range(256)) * 40
TWILIO_AUTH = ("AC0123456789abcdef0123456789abcdef", "twilio-auth-token")
TWILIO_BASIC = aiohttp.encode_basic_auth(*TWILIO_AUTH)
MEDIA_PATH = "/2010-04-01/Accounts/AC0123/Messages/MM0123/Media/ME0123"

Serve = Callable[..., Awaitable[TestServer]]


@pytest.fixture
async def serve() -> AsyncIterator[Serve]:
    """Starts an app on a loopback address of its own choosing; all are closed afterwards."""
    servers: list[TestServer] = []

    async def start(
        app: web.Application, *, host: str = "127.0.0.1", tls: ssl.SSLContext | None = None
    ) -> TestServer:
        server = TestServer(app, host=host)
        await server.start_server(ssl=tls)
        servers.append(server)
        return server

    yield start
    for server in servers:
        await server.close()


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    """The guarded session media is fetched with, let through to the loopback file hosts."""
    async with crawler_session(LOOPBACK) as session:
        yield session


async def _fetch_failure(
    http: aiohttp.ClientSession, url: str, **options: object
) -> MediaUnavailable:
    values: dict[str, object] = {"max_bytes": 1_000_000, "timeout": 2.0, **options}
    with pytest.raises(MediaUnavailable) as caught:
        await fetch_media(http, url, **values)  # type: ignore[arg-type]
    return caught.value


# -- downloads -----------------------------------------------------------------------------


async def test_a_file_is_downloaded_with_its_type_and_final_url(
    serve: Serve, http: aiohttp.ClientSession
) -> None:
    host = FakeMediaHost(files={"/voice": MediaFile(VOICE_NOTE, "audio/ogg; codecs=opus")})
    server = await serve(host.app())

    media = await fetch_media(http, str(server.make_url("/voice")), max_bytes=1_000_000, timeout=2)

    assert media.data == VOICE_NOTE
    assert media.content_type == "audio/ogg"
    assert media.url == str(server.make_url("/voice"))
    # Already compressed: asking for no compression keeps Content-Length the true size.
    assert host.requests[0].accept_encoding == "identity"


async def test_a_declared_length_above_the_limit_is_refused_before_the_body(
    serve: Serve, http: aiohttp.ClientSession
) -> None:
    # Promises 10 MB, sends 1 KiB and waits: only the Content-Length can tell in time.
    host = FakeMediaHost(files={"/big": MediaFile(b"x" * 1024, length=10_000_000)})
    server = await serve(host.app())

    started = time.monotonic()
    error = await _fetch_failure(http, str(server.make_url("/big")), timeout=1.5)

    assert (error.reason, error.transient, error.code) == ("too_large", False, "media_unavailable")
    assert time.monotonic() - started < 0.5


async def test_a_body_beyond_the_limit_stops_the_download(
    serve: Serve, http: aiohttp.ClientSession
) -> None:
    # No Content-Length, and the body never ends: only counting what arrives stops it.
    endless = MediaFile(b"y" * 4096, streamed=True, chunk=4096, endless=True)
    host = FakeMediaHost(files={"/endless": endless})
    server = await serve(host.app())

    started = time.monotonic()
    error = await _fetch_failure(http, str(server.make_url("/endless")), max_bytes=100_000)

    assert (error.reason, error.transient) == ("too_large", False)
    assert time.monotonic() - started < 0.5


@pytest.mark.parametrize(("size", "fits"), [(50_000, True), (50_001, False)])
async def test_the_limit_is_inclusive(
    serve: Serve, http: aiohttp.ClientSession, size: int, fits: bool
) -> None:
    host = FakeMediaHost(files={"/f": MediaFile(b"z" * size, streamed=True, chunk=7_000)})
    server = await serve(host.app())
    url = str(server.make_url("/f"))
    if fits:
        assert len((await fetch_media(http, url, max_bytes=50_000, timeout=2)).data) == size
    else:
        assert (await _fetch_failure(http, url, max_bytes=50_000)).reason == "too_large"


@pytest.mark.parametrize(
    "slow",
    [
        MediaFile(VOICE_NOTE, headers_delay=30),  # no answer at all
        MediaFile(b"a", streamed=True, delay=0.05, endless=True),  # a byte now and then
    ],
    ids=["headers", "body"],
)
async def test_the_whole_download_is_bounded_in_time(
    serve: Serve, http: aiohttp.ClientSession, slow: MediaFile
) -> None:
    host = FakeMediaHost(files={"/slow": slow})
    server = await serve(host.app())

    started = time.monotonic()
    error = await _fetch_failure(http, str(server.make_url("/slow")), timeout=0.3)

    assert (error.reason, error.transient) == ("timeout", True)
    assert time.monotonic() - started < 1.0


@pytest.mark.parametrize(
    ("status", "transient"), [(404, False), (403, False), (429, True), (503, True)]
)
async def test_an_error_status_names_itself(
    serve: Serve, http: aiohttp.ClientSession, status: int, transient: bool
) -> None:
    server = await serve(FakeMediaHost(statuses={"/gone": status}).app())
    error = await _fetch_failure(http, str(server.make_url("/gone")))
    assert (error.reason, error.transient) == (f"http_{status}", transient)


async def test_an_unreachable_host_is_transient(http: aiohttp.ClientSession) -> None:
    error = await _fetch_failure(http, f"http://127.0.0.1:{free_port()}/voice")
    assert (error.reason, error.transient) == ("connection", True)


@pytest.mark.parametrize("url", ["file:///etc/passwd", "ftp://127.0.0.1/voice", "/voice"])
async def test_only_http_urls_are_fetched(http: aiohttp.ClientSession, url: str) -> None:
    assert (await _fetch_failure(http, url)).reason == "url"


# -- redirects -----------------------------------------------------------------------------


async def test_credentials_go_to_the_first_host_and_a_signed_url_elsewhere_gets_none(
    serve: Serve, http: aiohttp.ClientSession
) -> None:
    """Twilio's way: the media URL wants Basic auth and redirects to a signed CDN URL."""
    cdn = FakeMediaHost(files={"/signed/ME0123": MediaFile(VOICE_NOTE)})
    # Another address on this machine: another host, as a CDN is.
    cdn_server = await serve(cdn.app(), host="127.0.0.2")
    signed = str(cdn_server.make_url("/signed/ME0123").with_query(Expires="1", Signature="s"))
    api = FakeMediaHost(
        authorization=TWILIO_BASIC,
        # First a redirect on the same host, which must keep the credentials.
        redirects={MEDIA_PATH: f"{MEDIA_PATH}/Content", f"{MEDIA_PATH}/Content": signed},
    )
    api_server = await serve(api.app())

    media = await fetch_media(
        http,
        str(api_server.make_url(MEDIA_PATH)),
        auth=TWILIO_AUTH,
        provider=(str(api_server.make_url("")),),
        max_bytes=10**6,
        timeout=2,
    )

    assert media.data == VOICE_NOTE
    assert media.url == signed
    assert [(seen.path, seen.authorization) for seen in api.requests] == [
        (MEDIA_PATH, TWILIO_BASIC),
        (f"{MEDIA_PATH}/Content", TWILIO_BASIC),
    ]
    assert [seen.authorization for seen in cdn.requests] == [None]


async def test_aiohttp_basic_auth_is_taken_too(serve: Serve, http: aiohttp.ClientSession) -> None:
    host = FakeMediaHost(authorization=TWILIO_BASIC, files={"/f": MediaFile(VOICE_NOTE)})
    server = await serve(host.app())
    with pytest.warns(
        DeprecationWarning, match="BasicAuth is deprecated"
    ):  # aiohttp 3.14 deprecates BasicAuth
        auth = aiohttp.BasicAuth(*TWILIO_AUTH)
    media = await fetch_media(
        http,
        str(server.make_url("/f")),
        auth=auth,
        provider=(str(server.make_url("")),),
        max_bytes=10**6,
        timeout=2,
    )
    assert media.data == VOICE_NOTE


async def test_an_authorization_header_is_dropped_on_a_redirect_to_another_host(
    serve: Serve, http: aiohttp.ClientSession
) -> None:
    """Meta's way: a Bearer token in the header; it must not follow the file elsewhere."""
    cdn = FakeMediaHost(files={"/file": MediaFile(VOICE_NOTE)})
    cdn_server = await serve(cdn.app(), host="127.0.0.2")
    graph = FakeMediaHost(
        authorization="Bearer meta-token", redirects={"/media/1": str(cdn_server.make_url("/file"))}
    )
    graph_server = await serve(graph.app())

    media = await fetch_media(
        http,
        str(graph_server.make_url("/media/1")),
        headers={"authorization": "Bearer meta-token", "User-Agent": "parley-test"},
        provider=(str(graph_server.make_url("")),),
        max_bytes=10**6,
        timeout=2,
    )

    assert media.data == VOICE_NOTE
    assert [seen.authorization for seen in graph.requests] == ["Bearer meta-token"]
    assert [seen.authorization for seen in cdn.requests] == [None]


@pytest.mark.parametrize(("hops", "allowed"), [(MAX_REDIRECTS, True), (MAX_REDIRECTS + 1, False)])
async def test_redirects_are_followed_three_times_and_no_more(
    serve: Serve, http: aiohttp.ClientSession, hops: int, allowed: bool
) -> None:
    assert MAX_REDIRECTS == 3
    host = FakeMediaHost(files={"/file": MediaFile(VOICE_NOTE)})
    host.redirects = {f"/r{n}": f"/r{n + 1}" for n in range(hops - 1)} | {f"/r{hops - 1}": "/file"}
    server = await serve(host.app())
    url = str(server.make_url("/r0"))

    if allowed:
        assert (await fetch_media(http, url, max_bytes=10**6, timeout=2)).data == VOICE_NOTE
    else:
        assert (await _fetch_failure(http, url)).reason == "redirect"
        assert "/file" not in host.paths()  # the fourth redirect is not followed


async def test_a_redirect_to_another_scheme_or_nowhere_is_refused(
    serve: Serve, http: aiohttp.ClientSession
) -> None:
    host = FakeMediaHost(redirects={"/ftp": "ftp://127.0.0.1/file"}, statuses={"/empty": 302})
    server = await serve(host.app())
    for path in ("/ftp", "/empty"):
        error = await _fetch_failure(http, str(server.make_url(path)))
        assert (error.reason, error.transient) == ("redirect", False)


# -- the outbound guard ---------------------------------------------------------------------

# The fake file hosts listen on loopback; a test lets the guard through to exactly the ones
# it names, as PARLEY_MEDIA_ALLOW_NETWORKS would.
OUTSIDE = ipaddress.ip_network("127.0.0.2/32")


async def test_media_is_fetched_only_through_the_outbound_guard(serve: Serve) -> None:
    host = FakeMediaHost(files={"/voice": MediaFile(VOICE_NOTE)})
    server = await serve(host.app())
    async with aiohttp.ClientSession() as plain:
        with pytest.raises(TypeError, match="crawler_session"):
            await fetch_media(plain, str(server.make_url("/voice")), max_bytes=10**6, timeout=2)
    assert host.requests == []


@pytest.mark.parametrize(
    "inside",
    ["http://127.0.0.1:{port}/secret", "http://localhost:{port}/secret", "http://[::1]:{port}/"],
)
async def test_a_redirect_to_a_private_address_is_refused_at_connect_time(
    serve: Serve, inside: str
) -> None:
    """A public-looking media host that sends the download on to the machine itself."""
    internal = FakeMediaHost(files={"/secret": MediaFile(b"root:x:0:0", "audio/ogg")})
    internal_server = await serve(internal.app())
    outside = FakeMediaHost(redirects={"/m": inside.format(port=internal_server.port)})
    outside_server = await serve(outside.app(), host="127.0.0.2")

    async with crawler_session([OUTSIDE]) as guarded:
        error = await _fetch_failure(guarded, str(outside_server.make_url("/m")))

    assert (error.reason, error.transient) == ("refused", False)
    assert outside.paths() == ["/m"]
    assert internal.requests == []  # checked on the address connected to: never reached


@pytest.mark.parametrize(
    "url", ["http://169.254.169.254/latest/meta-data/", "http://10.0.0.1/", "http://[fd00::1]/"]
)
async def test_a_private_media_url_is_refused_without_a_connection(url: str) -> None:
    async with crawler_session([OUTSIDE]) as guarded:
        started = time.monotonic()
        error = await _fetch_failure(guarded, url, timeout=5.0)
    assert (error.reason, error.transient) == ("refused", False)
    assert time.monotonic() - started < 1.0  # refused before any connection is tried


async def test_credentials_go_only_to_the_providers_own_origin(serve: Serve) -> None:
    """A media URL on another host gets no credentials at all, not even on its first hop."""
    elsewhere = FakeMediaHost(files={"/m": MediaFile(VOICE_NOTE)})
    elsewhere_server = await serve(elsewhere.app(), host="127.0.0.2")
    provider = FakeMediaHost(authorization=TWILIO_BASIC, files={"/m": MediaFile(VOICE_NOTE)})
    provider_server = await serve(provider.app())
    base = str(provider_server.make_url(""))

    async with crawler_session(LOOPBACK) as guarded:
        for server in (elsewhere_server, provider_server):
            media = await fetch_media(
                guarded,
                str(server.make_url("/m")),
                auth=TWILIO_AUTH,
                provider=(base,),
                max_bytes=10**6,
                timeout=2,
            )
            assert media.data == VOICE_NOTE

    assert [seen.authorization for seen in elsewhere.requests] == [None]
    assert [seen.authorization for seen in provider.requests] == [TWILIO_BASIC]


@pytest.mark.parametrize("kind", ["text/html", "application/json", "text/plain"])
async def test_a_body_that_is_no_media_is_not_read(serve: Serve, kind: str) -> None:
    host = FakeMediaHost(files={"/page": MediaFile(b"<h1>Staff passwords</h1>", kind)})
    server = await serve(host.app())
    async with crawler_session(LOOPBACK) as guarded:
        error = await _fetch_failure(guarded, str(server.make_url("/page")))
    assert (error.reason, error.transient) == ("not_media", False)


def _tls_contexts(folder: Path) -> tuple[ssl.SSLContext, ssl.SSLContext]:
    """A self-signed certificate for 127.0.0.1: the server's context and a client's that
    trusts it."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.now(UTC)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(minutes=5))
        .not_valid_after(now + timedelta(hours=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_pem = certificate.public_bytes(serialization.Encoding.PEM)
    (folder / "cert.pem").write_bytes(cert_pem)
    (folder / "key.pem").write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server.load_cert_chain(folder / "cert.pem", folder / "key.pem")
    return server, ssl.create_default_context(cadata=cert_pem.decode())


async def test_a_redirect_from_https_down_to_http_is_refused(serve: Serve, tmp_path: Path) -> None:
    plain = FakeMediaHost(files={"/file": MediaFile(VOICE_NOTE)})
    plain_server = await serve(plain.app())
    server_tls, client_tls = _tls_contexts(tmp_path)
    secure = FakeMediaHost(
        files={"/file": MediaFile(VOICE_NOTE)},
        redirects={"/same": "/file", "/down": str(plain_server.make_url("/file"))},
    )
    secure_server = await serve(secure.app(), tls=server_tls)
    assert secure_server.scheme == "https"

    async with crawler_session(LOOPBACK, tls=client_tls) as http:
        # https to https is fine (a relative Location included)...
        media = await fetch_media(
            http, str(secure_server.make_url("/same")), max_bytes=10**6, timeout=2
        )
        assert media.url == str(secure_server.make_url("/file"))
        # ...a downgrade is not, and the http host is never asked.
        error = await _fetch_failure(http, str(secure_server.make_url("/down")))

    assert (error.reason, error.transient) == ("redirect", False)
    assert plain.requests == []


# -- transcription -------------------------------------------------------------------------


@pytest.fixture
async def openai_fake(serve: Serve) -> tuple[FakeOpenAI, str]:
    fake = FakeOpenAI()
    server = await serve(fake.app())
    return fake, str(server.make_url("/v1"))


def _settings(**values: object) -> Settings:
    return Settings(_env_file=None, **values)  # type: ignore[call-arg, arg-type]


async def test_a_voice_note_is_transcribed_by_the_configured_model(
    openai_fake: tuple[FakeOpenAI, str],
) -> None:
    fake, url = openai_fake
    fake.transcripts[audio_key(VOICE_NOTE)] = "  Where is my order?\n"
    settings = _settings(
        llm_base_url=url, llm_api_key=KEY, transcribe_model="gpt-4o-mini-transcribe"
    )
    transcriber = open_transcriber(settings)
    assert transcriber is not None

    text = await transcriber.transcribe(VOICE_NOTE, content_type="audio/ogg; codecs=opus")
    await transcriber.close()

    assert text == "Where is my order?"
    (sent,) = fake.transcription_requests
    assert sent["model"] == "gpt-4o-mini-transcribe"
    assert (sent["filename"], sent["content_type"]) == ("audio.ogg", "audio/ogg")
    assert (sent["size"], sent["sha256"]) == (len(VOICE_NOTE), audio_key(VOICE_NOTE))
    assert fake.requests[0]["auth"] == f"Bearer {KEY}"


async def test_a_given_file_name_is_sent_as_is(openai_fake: tuple[FakeOpenAI, str]) -> None:
    fake, url = openai_fake
    fake.transcriber = lambda audio: f"{len(audio)} bytes heard"
    transcriber = OpenAITranscriber("whisper-1", api_key=KEY, base_url=url)
    text = await transcriber.transcribe(b"ID3...", content_type="audio/mpeg", filename="note.mp3")
    await transcriber.close()
    assert text == "6 bytes heard"
    assert fake.transcription_requests[0]["filename"] == "note.mp3"


@pytest.mark.parametrize(
    ("content_type", "filename"),
    [
        ("audio/ogg; codecs=opus", "audio.ogg"),
        ("audio/mpeg", "audio.mp3"),
        ("audio/mp4", "audio.m4a"),
        ("audio/x-wav", "audio.wav"),
        ("AUDIO/WEBM", "audio.webm"),
        ("audio/amr", "audio.amr"),
    ],
)
def test_the_file_name_tells_the_api_the_format(content_type: str, filename: str) -> None:
    assert audio_filename(content_type) == filename


@pytest.mark.parametrize(("status", "transient"), [(500, True), (503, True), (401, False)])
async def test_a_failed_transcription_says_whether_to_try_again(
    openai_fake: tuple[FakeOpenAI, str], status: int, transient: bool
) -> None:
    fake, url = openai_fake
    fake.transcription_failures = [status]
    transcriber = OpenAITranscriber("whisper-1", api_key=KEY, base_url=url)
    with pytest.raises(ModelFailed) as caught:
        await transcriber.transcribe(VOICE_NOTE, content_type="audio/ogg")
    await transcriber.close()

    assert caught.value.transient is transient
    assert caught.value.message == f"transcription failed: status {status}"
    assert len(fake.transcription_requests) == 1  # the caller retries, with back-off


async def test_a_format_the_api_refuses_is_permanent(openai_fake: tuple[FakeOpenAI, str]) -> None:
    fake, url = openai_fake
    transcriber = OpenAITranscriber("whisper-1", api_key=KEY, base_url=url)
    with pytest.raises(ModelFailed) as caught:
        await transcriber.transcribe(b"#!AMR\n", content_type="audio/amr")
    await transcriber.close()
    assert caught.value.transient is False
    assert fake.transcription_requests[0]["filename"] == "audio.amr"


async def test_a_slow_or_unreachable_api_is_transient(openai_fake: tuple[FakeOpenAI, str]) -> None:
    fake, url = openai_fake
    fake.transcription_delay = 5.0
    for base_url, reason in ((url, "timeout"), (f"http://127.0.0.1:{free_port()}/v1", None)):
        transcriber = OpenAITranscriber("whisper-1", api_key=KEY, base_url=base_url, timeout=0.3)
        started = time.monotonic()
        with pytest.raises(ModelFailed) as caught:
            await transcriber.transcribe(VOICE_NOTE, content_type="audio/ogg")
        await transcriber.close()
        assert caught.value.transient is True
        assert time.monotonic() - started < 1.0
        if reason:
            assert caught.value.message == f"transcription failed: {reason}"


async def test_a_twilio_voice_note_from_download_to_text(
    serve: Serve, openai_fake: tuple[FakeOpenAI, str]
) -> None:
    fake, url = openai_fake
    fake.transcripts[audio_key(VOICE_NOTE)] = "Can I still change my address?"
    cdn = FakeMediaHost(files={"/m/ME0123": MediaFile(VOICE_NOTE, "audio/ogg")})
    cdn_server = await serve(cdn.app(), host="127.0.0.2")
    api = FakeMediaHost(
        authorization=TWILIO_BASIC, redirects={MEDIA_PATH: str(cdn_server.make_url("/m/ME0123"))}
    )
    api_server = await serve(api.app())
    settings = _settings(
        llm_base_url=url,
        llm_api_key=KEY,
        transcribe_model="whisper-1",
        twilio_api_base=str(api_server.make_url("")),
        # the fake API and its "CDN", both on loopback, named explicitly
        media_allow_networks="127.0.0.1/32,127.0.0.2/32",
    )
    transcriber = open_transcriber(settings)
    assert transcriber is not None

    async with media_session(settings) as http:
        media = await fetch_media(
            http,
            str(api_server.make_url(MEDIA_PATH)),
            auth=TWILIO_AUTH,
            provider=(str(settings.twilio_api_base),),
            max_bytes=settings.media_max_bytes,
            timeout=settings.media_timeout_seconds,
        )
    text = await transcriber.transcribe(media.data, content_type=media.content_type)
    await transcriber.close()

    assert text == "Can I still change my address?"
    assert fake.transcription_requests[0]["model"] == "whisper-1"


# -- settings ------------------------------------------------------------------------------


@pytest.fixture
def no_parley_environment(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    import os

    for name in list(os.environ):
        if name.startswith(("PARLEY_", "OPENAI_")):
            monkeypatch.delenv(name)
    return monkeypatch


async def test_without_a_transcribe_model_there_is_no_transcriber(
    no_parley_environment: pytest.MonkeyPatch,
) -> None:
    assert open_transcriber(_settings(llm_api_key=KEY)) is None

    no_parley_environment.setenv("PARLEY_TRANSCRIBE_MODEL", "whisper-1")
    transcriber = open_transcriber(_settings(llm_api_key=KEY))
    assert transcriber is not None
    assert transcriber.model == "whisper-1"
    await transcriber.close()


def test_a_transcribe_model_without_an_api_is_a_config_error(
    no_parley_environment: pytest.MonkeyPatch,
) -> None:
    with pytest.raises(ConfigError, match="PARLEY_TRANSCRIBE_MODEL"):
        open_transcriber(_settings(transcribe_model="whisper-1"))


def test_media_limits_default_and_come_from_the_environment(
    no_parley_environment: pytest.MonkeyPatch,
) -> None:
    defaults = _settings()
    assert (defaults.media_max_bytes, defaults.media_timeout_seconds) == (16 * 1024 * 1024, 20.0)
    assert defaults.transcribe_model is None
    assert defaults.media_allow_networks == []  # public addresses only
    no_parley_environment.setenv("PARLEY_MEDIA_MAX_BYTES", "5000000")
    no_parley_environment.setenv("PARLEY_MEDIA_TIMEOUT_SECONDS", "7.5")
    no_parley_environment.setenv("PARLEY_MEDIA_ALLOW_NETWORKS", "10.20.0.0/16, fd00::/8")
    assert (_settings().media_max_bytes, _settings().media_timeout_seconds) == (5_000_000, 7.5)
    assert _settings().media_allow_networks == [
        ipaddress.ip_network("10.20.0.0/16"),
        ipaddress.ip_network("fd00::/8"),
    ]
    # the crawler's allow-list is its own
    assert _settings().crawl_allow_networks == []
