"""Malformed and random input at every public endpoint of the real app.

Every webhook (Twilio messages and delivery reports, Telegram), the widget's chat, clear and
live-event routes and the JSON turns API get random bytes, random JSON, random form fields,
the right shapes with one field wrong, huge and empty strings and bad charsets, signed (or
carrying their key) where the endpoint asks for it. Each answer must be a 2xx or a 4xx with
the JSON error body, never a 5xx; nothing is logged at ERROR or with a traceback; and a
refused request stores no row. The inputs reported in the issue are checked one by one first.
"""

from __future__ import annotations

import asyncio
import copy
import io
import json
import logging
import operator
import re
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl, quote, urlencode

import aiohttp
import pytest
from aiohttp.test_utils import TestServer
from hypothesis import HealthCheck, currently_in_test_context, event, given, settings
from hypothesis import strategies as st
from multidict import MultiDict
from twilio.request_validator import RequestValidator

from core.retrieval.embedders import UseEmbedder
from core.store import Agent, Agents, Database
from core.store.api_keys import ApiKeys
from core.store.vector_index import EmbedderIdentity
from gateway.app import create_app
from tests.conftest import MakeSettings

TWILIO_TOKEN = "fuzz-twilio-token-0123456789abcdef"
TELEGRAM_SECRET = "fuzz-telegram-secret-0123456789-abcdef"
FORM = "application/x-www-form-urlencoded"
# Every table a request from outside may write to.
TABLES = ("inbox", "outbox", "conversations", "messages", "turns", "usage", "content_gaps")

fuzzing = settings(
    max_examples=60,
    derandomize=True,  # the same inputs on every run
    database=None,
    deadline=None,
    suppress_health_check=[
        HealthCheck.function_scoped_fixture,  # one gateway serves every example
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
        HealthCheck.large_base_example,
    ],
)


@dataclass
class Answer:
    status: int
    content_type: str
    body: bytes


@dataclass
class Gateway:
    url: str
    port: int
    database: Database
    agent: Agent
    api_key: str
    session: aiohttp.ClientSession
    caplog: pytest.LogCaptureFixture

    async def counts(self) -> dict[str, int]:
        row = await self.database.pool.fetchrow(
            "SELECT " + ", ".join(f"(SELECT count(*) FROM {t}) AS {t}" for t in TABLES)
        )
        assert row is not None
        return dict(row)

    async def send(self, method: str, path: str, body: bytes, headers: Mapping[str, str]) -> Answer:
        skip = () if "Content-Type" in headers else ("Content-Type",)
        # aiohttp warns about sending a large body from bytes; from a file it does not.
        data = io.BytesIO(body) if len(body) > 65_536 else body
        async with self.session.request(
            method, self.url + path, data=data, headers=dict(headers), skip_auto_headers=skip
        ) as response:
            if method == "GET" and response.content_type == "text/event-stream":
                return Answer(response.status, response.content_type, b"")  # a live stream
            return Answer(response.status, response.content_type, await response.read())

    async def check(
        self, method: str, path: str, body: bytes = b"", headers: Mapping[str, str] | None = None
    ) -> Answer:
        """Send one request; it must be answered with a 2xx or a clear 4xx, log no error,
        and store nothing when refused."""
        self.caplog.clear()
        before = await self.counts()
        answer = await self.send(method, path, body, headers or {})
        if currently_in_test_context():
            event(f"answered {answer.status}")  # shown by --hypothesis-show-statistics
        shown = f"{method} {path} {body[:120]!r} {dict(headers or {})} -> {answer}"
        assert answer.status < 500, shown
        if answer.status >= 400:
            assert await self.counts() == before, f"a refused request stored rows: {shown}"
            if answer.status == 429 and answer.content_type == "text/event-stream":
                assert b"event: error" in answer.body  # the widget's over-budget answer
            else:
                assert answer.content_type == "application/json", shown
                error = json.loads(answer.body)["error"]
                assert set(error) == {"code", "message"}, shown
                assert error["code"] != "internal", shown
        self.assert_quiet(shown)
        return answer

    def assert_quiet(self, shown: str = "") -> None:
        loud = [
            f"{r.name}: {r.getMessage()}"
            for r in self.caplog.records
            if r.levelno >= logging.ERROR or r.exc_info
        ]
        assert not loud, f"{shown}\nlogged: {loud}"

    def sign(self, path: str, params: MultiDict[str]) -> str:
        return RequestValidator(TWILIO_TOKEN).compute_signature(self.url + path, params)


@pytest.fixture
async def gateway(
    make_settings: MakeSettings,
    database: Database,
    use_embedder: UseEmbedder,
    caplog: pytest.LogCaptureFixture,
) -> AsyncIterator[Gateway]:
    """The app from create_app with every channel configured; agent 'shop' exists."""
    agents = Agents(database.pool)
    await agents.create("shop", embedder=EmbedderIdentity.of(use_embedder))
    agent = await agents.update("shop", allowed_origins=["https://shop.example"])
    api_key = await ApiKeys(database.pool).create(agent.id)
    settings = make_settings(
        twilio_auth_token=TWILIO_TOKEN,
        telegram_webhook_secret=TELEGRAM_SECRET,
        telegram_bot_token="123456:ABC-fuzz",
    )
    server = TestServer(create_app(settings))
    await server.start_server()
    caplog.set_level(logging.INFO)
    async with aiohttp.ClientSession() as session:
        assert server.port is not None
        yield Gateway(
            str(server.make_url("")).rstrip("/"),
            server.port,
            database,
            agent,
            api_key,
            session,
            caplog,
        )
    await server.close()


def lenient_form(raw: bytes) -> MultiDict[str]:
    """The fields a lenient reader sees in ``raw`` (bad bytes become U+FFFD): what a forged
    signature is computed over, so that only strict reading refuses the request."""
    text = raw.decode("utf-8", "replace").rstrip()
    return MultiDict(parse_qsl(text, keep_blank_values=True))


async def raw_request(port: int, head: bytes, body: bytes = b"") -> tuple[int, bytes]:
    """One HTTP/1.1 request written byte for byte (header values no client library sends)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(
            head.rstrip(b"\r\n")
            + b"\r\nContent-Length: %d\r\nConnection: close\r\n\r\n" % len(body)
            + body
        )
        await writer.drain()
        answer = await asyncio.wait_for(reader.read(), 30)
    finally:
        writer.close()
    status_line, _, rest = answer.partition(b"\r\n")
    return int(status_line.split()[1]), rest.partition(b"\r\n\r\n")[2]


# --- The inputs reported in the issue, one by one ------------------------------------------

TWILIO_MESSAGE = {
    "MessageSid": "SM" + "1" * 32,
    "AccountSid": "AC" + "a" * 32,
    "From": "whatsapp:+31612345678",
    "To": "whatsapp:+14155238886",
    "Body": "Where is my order?",
    "NumMedia": "0",
}
DATE = 1_717_000_000
PRIVATE = {"id": 555000111, "first_name": "Anna", "type": "private"}
USER = {"id": 555000111, "is_bot": False, "first_name": "Anna", "language_code": "nl"}
TELEGRAM_UPDATE = {
    "update_id": 700001,
    "message": {
        "message_id": 11,
        "from": USER,
        "chat": PRIVATE,
        "date": DATE,
        "text": "Where is my order?",
    },
}


def _update(**message: Any) -> bytes:
    return json.dumps({"update_id": 5, "message": TELEGRAM_UPDATE["message"] | message}).encode()


TELEGRAM_REPORTED = {
    "message is a string": b'{"update_id": 5, "message": "str"}',
    "chat is null": _update(chat=None),
    "date is 1e300": _update(date=1e300),
    "nested 100000 deep": b"[" * 100_000 + b"]" * 100_000,
    "nested inside the message": b'{"update_id": 5, "message": ' + b"[" * 5000 + b"]" * 5000 + b"}",
    "update_id is text": b'{"update_id": "x"}',
    "update_id beyond a bigint": b'{"update_id": 1000000000000000000000000000000}',
    "update_id is a fraction": b'{"update_id": 5.5}',
    "a number out of range": _update(entities=[{"offset": 1}]).replace(b": 1}", b": 1e999}"),
    "Infinity": _update(entities=[{"offset": float("inf")}]),
    "a lone surrogate": _update(text="\\ud800 hi").replace(b"\\\\ud800", b"\\ud800"),
    "text is a number": _update(text=12),
    "from is a list": _update(**{"from": []}),
    "a digit string of 5000 digits": b'{"update_id": 5, "x": 1' + b"0" * 5000 + b"}",
    "not UTF-8": b'{"update_id": 5, "message": {"text": "\xff\xfe"}}',
}


TELEGRAM_HEADERS = {
    "Content-Type": "application/json",
    "X-Telegram-Bot-Api-Secret-Token": TELEGRAM_SECRET,
}


async def test_a_malformed_telegram_update_is_400_and_stores_nothing(gateway: Gateway) -> None:
    for name, body in TELEGRAM_REPORTED.items():
        answer = await gateway.check("POST", "/webhooks/telegram/shop", body, TELEGRAM_HEADERS)
        assert answer.status == 400, (name, answer)
        assert json.loads(answer.body)["error"]["code"] == "invalid_input", name
    # A well-formed update is stored.
    valid = await gateway.check("POST", "/webhooks/telegram/shop", _update(), TELEGRAM_HEADERS)
    assert valid.status == 200
    assert (await gateway.counts())["inbox"] == 1


REPORT = {"MessageSid": "SM" + "2" * 32, "MessageStatus": "delivered", "ErrorCode": ""}
MESSAGE_PATH = "/webhooks/twilio/shop"
REPORT_PATHS = ("/webhooks/twilio/status", "/webhooks/twilio/status?agent=shop")


def _fields_for(path: str) -> dict[str, str]:
    """What Twilio posts to ``path``: a message, or a delivery report."""
    return REPORT if "status" in path else TWILIO_MESSAGE


TWILIO_REPORTED = {
    "bytes that are not UTF-8": (
        MESSAGE_PATH, *REPORT_PATHS, FORM, lambda f: b"Body=\xff\xfe&" + urlencode(f).encode()
    ),
    "escapes that are not UTF-8": (
        MESSAGE_PATH, *REPORT_PATHS, FORM, lambda f: b"Body=%ff%fe&" + urlencode(f).encode()
    ),
    "an unknown charset": (
        MESSAGE_PATH, *REPORT_PATHS, FORM + "; charset=bogus-xyz", lambda f: urlencode(f).encode()
    ),
    "another charset": (
        MESSAGE_PATH, *REPORT_PATHS, FORM + "; charset=utf-16", lambda f: urlencode(f).encode()
    ),
    "not a form": (
        MESSAGE_PATH, *REPORT_PATHS, "application/json", lambda f: json.dumps(f).encode()
    ),
    "a message id of 5000 characters": (
        MESSAGE_PATH, *REPORT_PATHS, FORM,
        lambda f: urlencode(f | {"MessageSid": "SM" + "9" * 5000}).encode(),
    ),
    "a sender of 5000 characters": (
        MESSAGE_PATH, FORM, lambda f: urlencode(f | {"From": "whatsapp:+" + "3" * 5000}).encode()
    ),
}  # fmt: skip


async def test_a_malformed_twilio_form_is_400_even_when_signed(gateway: Gateway) -> None:
    for name, (*paths, content_type, make) in TWILIO_REPORTED.items():
        for path in paths:
            body = make(_fields_for(path))
            # Signed over what a lenient reader makes of it: only strict reading refuses it.
            signature = gateway.sign(path, lenient_form(body))
            headers = {"Content-Type": content_type, "X-Twilio-Signature": signature}
            answer = await gateway.check("POST", path, body, headers)
            assert answer.status == 400, (name, path, answer)
            assert json.loads(answer.body)["error"]["code"] == "invalid_input", (name, path)


async def test_a_twilio_webhook_with_a_host_that_is_no_host_is_400(gateway: Gateway) -> None:
    body = urlencode(TWILIO_MESSAGE).encode()
    for host in (b"a:b", b"[::1", b"shop.example:\xff"):
        status, answer = await raw_request(
            gateway.port,
            b"POST /webhooks/twilio/shop HTTP/1.1\r\nHost: " + host + b"\r\n"
            b"X-Twilio-Signature: c2lnbmF0dXJl\r\nContent-Type: " + FORM.encode(),
            body,
        )
        assert status == 400, (host, answer)
        assert json.loads(answer)["error"]["code"] == "invalid_input"
    assert (await gateway.counts())["inbox"] == 0
    gateway.assert_quiet()


async def test_keys_that_are_not_utf8_are_refused_as_wrong_keys(gateway: Gateway) -> None:
    chat = json.dumps({"message": "Shipping?", "session_id": "session-0001"}).encode()
    form = urlencode(TWILIO_MESSAGE).encode()
    json_type, form_type = b"application/json", FORM.encode()
    events = b"GET /api/v1/agents/shop/conversations/events?session_id=session-0001&key=%ff"
    for head, content_type, body, expected in (
        (b"POST /api/v1/agents/shop/chat HTTP/1.1\r\nX-Parley-Key: \xff\xfe", json_type, chat, 401),
        (b"POST /api/v1/agents/shop/conversations/clear HTTP/1.1\r\nX-Parley-Key: \xff",
         json_type, chat, 401),
        (events + b" HTTP/1.1", json_type, b"", 401),
        (b"POST /api/v1/agents/shop/turns HTTP/1.1\r\nAuthorization: Bearer \xff\xfe",
         json_type, chat, 401),
        (b"POST /api/v1/agents/shop/turns HTTP/1.1\r\nAuthorization: Bearer \xc3\xa9",
         json_type, chat, 401),
        (b"POST /webhooks/telegram/shop HTTP/1.1\r\nX-Telegram-Bot-Api-Secret-Token: \xff",
         json_type, chat, 403),
        (b"POST /webhooks/twilio/shop HTTP/1.1\r\nX-Twilio-Signature: \xff\xfe",
         form_type, form, 403),
    ):  # fmt: skip
        status, answer = await raw_request(
            gateway.port, head + b"\r\nHost: x\r\nContent-Type: " + content_type, body
        )
        assert status == expected, (head, answer)
        assert set(json.loads(answer)["error"]) == {"code", "message"}
    assert await gateway.counts() == dict.fromkeys(TABLES, 0)
    gateway.assert_quiet()


CHAT = b'{"message": "Shipping?", "session_id": "session-0001"}'
CHAT_REPORTED = {
    "an unknown charset": ("application/json; charset=bogus-xyz", CHAT),
    "another charset": ("application/json; charset=utf-16", CHAT),
    "bytes that are not UTF-8": ("application/json", CHAT.replace(b"?", b"\xff?")),
    "a lone surrogate": ("application/json", CHAT.replace(b"Shipping?", b"\\ud800")),
    "a number out of range": ("application/json", CHAT.replace(b'"Shipping?"', b"1e999")),
    "nested 100000 deep": ("application/json", b"[" * 100_000 + b"]" * 100_000),
    "a page nested 50 deep": (
        "application/json", CHAT[:-1] + b', "page": ' + b"[" * 50 + b"]" * 50 + b"}"
    ),
    "an empty body": ("application/json", b""),
    "not an object": ("application/json", b"[]"),
    "a message that is a list": ("application/json", CHAT.replace(b'"Shipping?"', b'["hi"]')),
}  # fmt: skip


async def test_a_malformed_chat_or_turn_is_400_and_stores_nothing(gateway: Gateway) -> None:
    for path in ("/api/v1/agents/shop/chat", "/api/v1/agents/shop/turns"):
        for name, (content_type, body) in CHAT_REPORTED.items():
            headers = {
                "Content-Type": content_type,
                "X-Parley-Key": gateway.agent.widget_key,
                "Authorization": f"Bearer {gateway.api_key}",
            }
            answer = await gateway.check("POST", path, body, headers)
            assert answer.status == 400, (path, name, answer)
            assert json.loads(answer.body)["error"]["code"] == "invalid_input", (path, name)


async def test_a_bad_resume_point_or_session_on_the_live_stream_is_400(gateway: Gateway) -> None:
    key = gateway.agent.widget_key
    for query, last_event_id in (
        ("since=9999999999999999999", None),  # beyond a bigint: the stream opened, then failed
        ("since=9223372036854775808", None),
        ("since=%C2%B2", None),  # "²": a digit to str.isdigit(), not to int()
        ("since=%D9%A1%D9%A2", None),  # Arabic-Indic digits
        ("since=-1", None),
        ("since=1e3", None),
        ("since=%ff", None),
        ("", "9999999999999999999"),
        ("", "²"),
    ):
        headers = {} if last_event_id is None else {"Last-Event-ID": last_event_id}
        path = f"/api/v1/agents/shop/conversations/events?session_id=session-0001&key={key}"
        answer = await gateway.check("GET", f"{path}&{query}", headers=headers)
        assert answer.status == 400, (query, last_event_id, answer)
        assert json.loads(answer.body)["error"]["code"] == "invalid_input"
    newline = await gateway.check(
        "GET", f"/api/v1/agents/shop/conversations/events?session_id=session-0001%0A&key={key}"
    )
    assert newline.status == 400, newline


async def test_an_agent_name_no_agent_can_have_is_404(gateway: Gateway) -> None:
    fields = MultiDict(TWILIO_MESSAGE | {"MessageStatus": "delivered"})
    for path in (
        "/webhooks/twilio/status?agent=%00",
        "/webhooks/twilio/status?agent=" + "a" * 5000,
        "/webhooks/twilio/status?agent=Shop",
        "/webhooks/twilio/Sh%C3%B6p",
        "/api/v1/agents/Sh%C3%B6p/chat",
    ):
        headers = {
            "Content-Type": FORM,
            "X-Twilio-Signature": gateway.sign(path, fields),
            "X-Parley-Key": gateway.agent.widget_key,
        }
        answer = await gateway.check("POST", path, urlencode(fields).encode(), headers)
        assert answer.status == 404, (path, answer)


# --- Random input --------------------------------------------------------------------------

SHORT_TEXT = st.text(max_size=30)
HUGE_TEXT = st.builds(
    operator.mul,
    st.sampled_from(["a", "é", "😀", "\x00", " ", "<"]),
    st.sampled_from([0, 1, 2_000, 4_001, 70_000, 300_000]),
)
ODD_TEXT = st.sampled_from(
    ["", " ", "\x00", "\ufeff", "\u202e", "%ff", "null", "1e999", "NaN", "-1", "²", "\r\n"]
)
TEXTS = st.one_of(SHORT_TEXT, ODD_TEXT, HUGE_TEXT)
SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.integers(min_value=-(10**40), max_value=10**40),
    st.floats(),  # NaN and infinities included
    TEXTS,
)
JSON_VALUES = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(SHORT_TEXT, inner, max_size=4),
    max_leaves=10,
)
DEEP = st.integers(min_value=20, max_value=3_000).map(lambda n: b"[" * n + b"]" * n)
ODD_BODIES = st.sampled_from(
    [b"", b"{", b"\xff\xfe", b"null", b"[]", b'{"a": 1e999}', b"1" + b"0" * 5000, b'"\\ud800"']
)


def _paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every key path into nested dicts and lists, ``value`` itself first."""
    found = [prefix]
    if isinstance(value, dict):
        for key, child in value.items():
            found += _paths(child, (*prefix, key))
    elif isinstance(value, list):
        for index, child in enumerate(value):
            found += _paths(child, (*prefix, index))
    return found


@st.composite
def one_field_wrong(draw: st.DrawFn, template: dict[str, Any], values: Any = JSON_VALUES) -> Any:
    """``template`` with one place replaced by a random value, removed, or given a neighbour."""
    body = copy.deepcopy(template)
    path = draw(st.sampled_from(_paths(template)[1:]))
    *parents, last = path
    holder = body
    for key in parents:
        holder = holder[key]
    action = draw(st.sampled_from(["replace", "replace", "remove", "add"]))
    if action == "replace":
        holder[last] = draw(values)
    elif action == "remove":
        del holder[last]
    elif isinstance(holder, dict):
        holder[draw(SHORT_TEXT)] = draw(values)
    return body


def json_bodies(template: dict[str, Any]) -> st.SearchStrategy[bytes]:
    def dump(value: Any) -> bytes:
        return json.dumps(value, ensure_ascii=False).encode()

    return st.one_of(
        one_field_wrong(template).map(dump),
        one_field_wrong(template).map(dump),
        JSON_VALUES.map(dump),
        st.binary(max_size=200),
        DEEP,
        ODD_BODIES,
    )


JSON_TYPES = st.sampled_from(
    ["application/json"] * 12
    + ["application/json; charset=utf-8", "application/json; charset=bogus-xyz",
       "application/json; charset=latin-1", "text/plain", FORM, "multipart/form-data; boundary=b"]
)  # fmt: skip


@fuzzing
@given(
    body=json_bodies(TELEGRAM_UPDATE),
    content_type=JSON_TYPES,
    secret=st.sampled_from([True, True, True, True, False]),
)
async def test_random_telegram_updates(
    gateway: Gateway, body: bytes, content_type: str, secret: bool
) -> None:
    headers = {"Content-Type": content_type}
    if secret:
        headers["X-Telegram-Bot-Api-Secret-Token"] = TELEGRAM_SECRET
    answer = await gateway.check("POST", "/webhooks/telegram/shop", body, headers)
    if answer.status == 200:
        assert json.loads(answer.body) == {}


TWILIO_NAMES = st.one_of(
    st.sampled_from(
        ["MessageSid", "From", "To", "Body", "NumMedia", "MessageStatus", "ErrorCode",
         "AccountSid", "MediaUrl0", "SmsSid"]
    ),
    SHORT_TEXT,
)  # fmt: skip
TWILIO_FIELDS = st.one_of(
    st.lists(st.tuples(TWILIO_NAMES, TEXTS), max_size=8),
    one_field_wrong(TWILIO_MESSAGE | {"MessageStatus": "delivered"}, TEXTS).map(
        lambda fields: list(fields.items())
    ),
)
TWILIO_PATHS = st.sampled_from(
    ["/webhooks/twilio/shop"] * 3 + ["/webhooks/twilio/status"] * 2
    + ["/webhooks/twilio/status?agent=shop"] * 2
    + ["/webhooks/twilio/status?agent=nope", "/webhooks/twilio/nope"]
)  # fmt: skip
FORM_TYPES = st.sampled_from(
    [FORM] * 12
    + [FORM + "; charset=UTF-8", FORM + "; charset=bogus-xyz", FORM + "; charset=latin-1",
       "application/json", "text/plain", "multipart/form-data; boundary=b", ""]
)  # fmt: skip


@fuzzing
@given(
    path=TWILIO_PATHS,
    body=st.one_of(
        TWILIO_FIELDS.map(lambda pairs: urlencode(pairs).encode()),
        TWILIO_FIELDS.map(lambda pairs: urlencode(pairs).encode()),
        st.binary(max_size=300),
        ODD_BODIES,
    ),
    content_type=FORM_TYPES,
    signature=st.sampled_from(["signed"] * 6 + ["none", "wrong"]),
)
async def test_random_twilio_webhooks(
    gateway: Gateway, path: str, body: bytes, content_type: str, signature: str
) -> None:
    headers = {"Content-Type": content_type} if content_type else {}
    if signature == "signed":
        headers["X-Twilio-Signature"] = gateway.sign(path, lenient_form(body))
    elif signature == "wrong":
        headers["X-Twilio-Signature"] = "RSOYDt4T1cUTdK1PDd93/VVr8B8="
    answer = await gateway.check("POST", path, body, headers)
    if answer.status == 200:
        assert answer.content_type == "text/xml"


CHAT_BODY = {
    "message": "Shipping to Belgium?",
    "session_id": "session-0001",
    "page": {"url": "https://shop.example/en/faq", "title": "FAQ", "context": "Delivery"},
    "language": "en",
}
TURN_BODY = CHAT_BODY | {"session_id": "api-session-1"}
CLEAR_BODY = {"session_id": "session-0001"}


@fuzzing
@given(
    route=st.sampled_from(["chat", "chat", "conversations/clear"]),
    body=st.one_of(json_bodies(CHAT_BODY), json_bodies(CLEAR_BODY)),
    content_type=JSON_TYPES,
    key=st.sampled_from(["right", "right", "right", "wrong", "none"]),
    origin=st.sampled_from([None, None, "https://shop.example", "https://evil.example", "null"]),
)
async def test_random_widget_requests(
    gateway: Gateway, route: str, body: bytes, content_type: str, key: str, origin: str | None
) -> None:
    headers = {"Content-Type": content_type}
    if key != "none":
        headers["X-Parley-Key"] = gateway.agent.widget_key if key == "right" else "pk_wrong"
    if origin is not None:
        headers["Origin"] = origin
    await gateway.check("POST", f"/api/v1/agents/shop/{route}", body, headers)


@fuzzing
@given(
    body=json_bodies(TURN_BODY),
    content_type=JSON_TYPES,
    authorization=st.sampled_from(["right", "right", "right", "wrong", "basic", "none"]),
)
async def test_random_turns(
    gateway: Gateway, body: bytes, content_type: str, authorization: str
) -> None:
    headers = {"Content-Type": content_type}
    if authorization == "right":
        headers["Authorization"] = f"Bearer {gateway.api_key}"
    elif authorization == "wrong":
        headers["Authorization"] = "Bearer sk_wrong"
    elif authorization == "basic":
        headers["Authorization"] = "Basic c2hvcDpzaG9w"
    answer = await gateway.check("POST", "/api/v1/agents/shop/turns", body, headers)
    if answer.status == 200:
        assert set(json.loads(answer.body)) >= {"answer", "session_id", "conversation_id"}


def _not_a_message_id(value: str) -> bool:
    return value != "" and not re.fullmatch(r"[0-9]{1,18}", value)


NOT_A_MESSAGE_ID = st.one_of(
    SHORT_TEXT.filter(_not_a_message_id),
    st.integers(min_value=2**63, max_value=10**30).map(str),
    st.sampled_from(["²", "١٢", "-1", "+1", " 1", "1 ", "0x10", "1e3", "1.0"]),
)
PRINTABLE = st.text(st.characters(min_codepoint=0x21, max_codepoint=0x7E), min_size=1)


@fuzzing
@given(
    session_id=st.one_of(st.just("session-0001"), SHORT_TEXT),
    key=st.sampled_from(["right", "right", "wrong", "none"]),
    since=NOT_A_MESSAGE_ID,
    last_event_id=st.one_of(st.none(), PRINTABLE.filter(_not_a_message_id)),
)
async def test_random_live_stream_requests(
    gateway: Gateway, session_id: str, key: str, since: str, last_event_id: str | None
) -> None:
    """Every request here is wrong in at least its resume point: a 4xx, never a stream."""
    query = {"session_id": session_id, "since": since}
    if key != "none":
        query["key"] = gateway.agent.widget_key if key == "right" else "pk_wrong"
    headers = {} if last_event_id is None else {"Last-Event-ID": last_event_id}
    path = "/api/v1/agents/shop/conversations/events?" + urlencode(query, quote_via=quote)
    answer = await gateway.check("GET", path, headers=headers)
    assert 400 <= answer.status < 500, answer
