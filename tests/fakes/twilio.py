"""A local Twilio Messages API, scriptable: `POST /2010-04-01/Accounts/{Sid}/Messages.json`
sends (a ``Body``, or an approved template: ``ContentSid`` with ``ContentVariables``), `GET` on
the same path lists (filtered by To, From and DateSent, newest first, paged);
`GET /2010-04-01/Accounts/{Sid}.json` answers the account (its name and status)."""

from __future__ import annotations

import asyncio
import base64
import binascii
import email.utils
import json
import re
import uuid
from dataclasses import dataclass, field
from datetime import UTC, date, datetime
from typing import Any, NamedTuple
from urllib.parse import urlencode

from aiohttp import web

MAX_BODY = 1600
_POLL = 0.01

_MESSAGES = {
    20001: "Invalid parameter",
    20003: "Authenticate",
    20404: "The requested resource was not found",
    20429: "Too Many Requests",
    20500: "An internal server error has occurred",
    21211: "Invalid 'To' Phone Number",
    21602: "Message body is required.",
    21603: "'From' phone number is required.",
    21604: "'To' phone number is required.",
    21610: "Attempt to send to unsubscribed recipient",
    21614: "'To' number is not a valid mobile number",
    21617: "The concatenated message body exceeds the 1600 character limit.",
    21655: "The ContentSid is Invalid",
    21656: "The ContentVariables Parameter is invalid",
    63016: "Failed to send freeform message because you are outside the allowed window.",
}
_CONTENT_SID = re.compile(r"HX[0-9a-fA-F]{32}")


class Failure(NamedTuple):
    """One scripted error answer: HTTP status, Twilio code (None: the status's own)."""

    status: int
    code: int | None = None
    retry_after: str | None = None  # the Retry-After header, when given


def _error(status: int, code: int | None, headers: dict[str, str] | None = None) -> web.Response:
    if code is None:
        code = {401: 20003, 404: 20404, 429: 20429}.get(status, 20500)
    body = {
        "code": code,
        "message": _MESSAGES.get(code, "Error"),
        "more_info": f"https://www.twilio.com/docs/errors/{code}",
        "status": status,
    }
    return web.json_response(body, status=status, headers=headers)


def _sid(prefix: str) -> str:
    return prefix + uuid.uuid4().hex


@dataclass
class FakeTwilio:
    """State of the fake: credentials it accepts, failures to serve first, what it received.

    ``fail_next`` entries are `Failure`s or plain tuples ``(status, code[, retry_after])``;
    each is served once, in order, before requests succeed again.
    """

    account_sid: str = "AC" + "0" * 32
    auth_token: str = "fake-twilio-auth-token-5f2c"
    friendly_name: str = "Parley test account"
    fail_next: list[Failure | tuple[Any, ...]] = field(default_factory=list)
    succeed_first: int = 0  # messages to accept before `fail_next` is served
    hang: bool = False  # requests are never answered (until the client gives up)
    # Accepted messages are recorded at once but answered this many seconds later (or not at
    # all when the client has gone by then): an answer lost after Twilio accepted the message.
    answer_late_by: float = 0.0
    # Failures served to list requests (`Failure`s or tuples), one each, before lists succeed.
    fail_list_next: list[Failure | tuple[Any, ...]] = field(default_factory=list)
    # WhatsApp's 24-hour window has closed for every customer: free text (a Body) fails with
    # 63016, as Twilio answers it; approved templates (a ContentSid) still go out.
    window_closed: bool = False
    # Accepted messages, in order: {"sid", "to", "from", "body", "content_sid",
    # "content_variables", "status_callback", "status", "date_created", "date_sent"}
    # (datetimes in UTC, whole seconds, as Twilio keeps them; the fake sends a message the
    # moment it accepts it). A template's text is Twilio's, unknown here: its "body" is "",
    # its "content_sid" and "content_variables" (the JSON read into a dict) are as sent.
    messages: list[dict[str, Any]] = field(default_factory=list)
    # Every request to the Messages route, accepted or not: {"form", "status", "code"}.
    requests: list[dict[str, Any]] = field(default_factory=list)
    # Every list request: its query parameters ({"To", "From", "DateSent>", "PageSize", ...}).
    lists: list[dict[str, str]] = field(default_factory=list)

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/2010-04-01/Accounts/{sid}/Messages.json", self._create)
        app.router.add_get("/2010-04-01/Accounts/{sid}/Messages.json", self._list)
        app.router.add_get("/2010-04-01/Accounts/{sid}.json", self._account)
        return app

    @property
    def bodies(self) -> list[str]:
        return [m["body"] for m in self.messages]

    def _authorized(self, request: web.Request) -> bool:
        scheme, _, encoded = request.headers.get("Authorization", "").partition(" ")
        if scheme.lower() != "basic":
            return False
        try:
            user, _, password = base64.b64decode(encoded).decode().partition(":")
        except (binascii.Error, UnicodeDecodeError):
            return False
        return user == self.account_sid and password == self.auth_token

    def _answer(
        self, form: dict[str, str], response: web.Response, code: int | None
    ) -> web.Response:
        self.requests.append({"form": form, "status": response.status, "code": code})
        return response

    def _refused(self, request: web.Request) -> web.Response | None:
        if not self._authorized(request):
            return _error(401, 20003)
        if request.match_info["sid"] != self.account_sid:
            return _error(404, 20404)
        return None

    async def _account(self, request: web.Request) -> web.Response:
        """The account resource, as Twilio answers a fetch of it with its credentials."""
        refused = self._refused(request)
        if refused is not None:
            return refused
        return web.json_response(
            {
                "sid": self.account_sid,
                "friendly_name": self.friendly_name,
                "status": "active",
                "type": "Full",
                "date_created": email.utils.format_datetime(datetime(2024, 1, 1, tzinfo=UTC)),
                "uri": f"/2010-04-01/Accounts/{self.account_sid}.json",
            }
        )

    async def _create(self, request: web.Request) -> web.StreamResponse:
        form = {k: str(v) for k, v in (await request.post()).items()}
        if self.hang:
            await _until_gone(request, None)
            return self._answer(form, web.Response(status=499), None)
        refused = self._refused(request)
        if refused is not None:
            code = {401: 20003, 404: 20404}[refused.status]
            return self._answer(form, refused, code)
        if self.fail_next and len(self.messages) >= self.succeed_first:
            failure = Failure(*self.fail_next.pop(0))
            headers = {"Retry-After": failure.retry_after} if failure.retry_after else None
            response = _error(failure.status, failure.code, headers)
            return self._answer(form, response, failure.code)
        content = "ContentSid" in form
        for name, code in (("To", 21604), ("From", 21603), ("Body", 21602)):
            if not form.get(name) and not (name == "Body" and content):
                return self._answer(form, _error(400, code), code)
        variables: dict[str, str] | None = None
        if content:
            variables = _content_variables(form.get("ContentVariables"))
            if not _CONTENT_SID.fullmatch(form["ContentSid"]):
                return self._answer(form, _error(400, 21655), 21655)
            if variables is None:
                return self._answer(form, _error(400, 21656), 21656)
        elif len(form["Body"]) > MAX_BODY:
            return self._answer(form, _error(400, 21617), 21617)
        elif self.window_closed:
            return self._answer(form, _error(400, 63016), 63016)
        now = datetime.now(UTC).replace(microsecond=0)
        record = {
            "sid": _sid("SM"),
            "to": form["To"],
            "from": form["From"],
            "body": "" if content else form["Body"],
            "content_sid": form.get("ContentSid"),
            "content_variables": variables,
            "status_callback": form.get("StatusCallback"),
            "status": "queued",
            "date_created": now,
            "date_sent": now,
        }
        self.messages.append(record)
        # The create answer shows the message as just queued: not sent yet.
        message = {**self._resource(record), "date_sent": None}
        if self.answer_late_by > 0:
            await _until_gone(request, self.answer_late_by)
        return self._answer(form, web.json_response(message, status=201), None)

    def _resource(self, record: dict[str, Any]) -> dict[str, Any]:
        """A message as Twilio's JSON shows it."""
        sid = record["sid"]
        created = email.utils.format_datetime(record["date_created"], usegmt=True)
        sent = record["date_sent"]
        return {
            "account_sid": self.account_sid,
            "api_version": "2010-04-01",
            "body": record["body"],
            "date_created": created,
            "date_sent": None if sent is None else email.utils.format_datetime(sent, usegmt=True),
            "date_updated": created,
            "direction": "outbound-api",
            "error_code": None,
            "error_message": None,
            "from": record["from"],
            "messaging_service_sid": None,
            "num_media": "0",
            "num_segments": "1",
            "price": None,
            "price_unit": "USD",
            "sid": sid,
            "status": record["status"],
            "subresource_uris": {
                "media": f"/2010-04-01/Accounts/{self.account_sid}/Messages/{sid}/Media.json"
            },
            "to": record["to"],
            "uri": f"/2010-04-01/Accounts/{self.account_sid}/Messages/{sid}.json",
        }

    async def _list(self, request: web.Request) -> web.Response:
        """Messages newest first (by send date; unsent ones last), filtered and paged the way
        Twilio does: ``To``, ``From``, ``DateSent`` / ``DateSent>`` / ``DateSent<`` (a day,
        or a day and time), ``PageSize`` (default 50), ``Page`` with its ``PageToken``."""
        query = {k: str(v) for k, v in request.query.items()}
        self.lists.append(query)
        refused = self._refused(request)
        if refused is not None:
            return refused
        if self.fail_list_next:
            failure = Failure(*self.fail_list_next.pop(0))
            headers = {"Retry-After": failure.retry_after} if failure.retry_after else None
            return _error(failure.status, failure.code, headers)
        try:
            size = min(int(query.get("PageSize", "50")), 1000)
            page = int(query.get("Page", "0"))
            bounds = {key: _when(query[key]) for key in _DATE_FILTERS if key in query}
        except ValueError:
            return _error(400, 20001)
        found = [
            m
            for m in self.messages
            if query.get("To", m["to"]) == m["to"]
            and query.get("From", m["from"]) == m["from"]
            and all(_date_matches(m["date_sent"], key, bound) for key, bound in bounds.items())
        ]
        oldest = datetime.min.replace(tzinfo=UTC)
        found.sort(key=lambda m: m["date_sent"] or oldest, reverse=True)
        chunk = found[page * size : (page + 1) * size]
        path = f"/2010-04-01/Accounts/{self.account_sid}/Messages.json"
        kept = {k: v for k, v in query.items() if k not in ("Page", "PageToken", "PageSize")}

        def uri(number: int, token: str | None = None) -> str:
            params = {**kept, "PageSize": str(size), "Page": str(number)}
            if token is not None:
                params["PageToken"] = token
            return f"{path}?{urlencode(params)}"

        more = len(found) > (page + 1) * size
        body = {
            "end": page * size + max(len(chunk) - 1, 0),
            "first_page_uri": uri(0),
            "messages": [self._resource(m) for m in chunk],
            "next_page_uri": uri(page + 1, "PA" + chunk[-1]["sid"]) if more else None,
            "page": page,
            "page_size": size,
            "previous_page_uri": uri(page - 1, "PB" + chunk[0]["sid"]) if page and chunk else None,
            "start": page * size,
            "uri": uri(page, query.get("PageToken")),
        }
        return web.json_response(body)


_DATE_FILTERS = ("DateSent", "DateSent>", "DateSent<")


def _content_variables(value: str | None) -> dict[str, str] | None:
    """``ContentVariables`` as Twilio takes it: a JSON object of text values (none: {})."""
    if value is None:
        return {}
    try:
        variables = json.loads(value)
    except ValueError:
        return None
    if not isinstance(variables, dict) or not all(isinstance(v, str) for v in variables.values()):
        return None
    return variables


def _when(value: str) -> date | datetime:
    """A DateSent filter value: ``YYYY-MM-DD``, or with a time (as twilio-python sends it)."""
    if "T" in value:
        return datetime.strptime(value, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
    return date.fromisoformat(value)


def _date_matches(sent: datetime | None, key: str, bound: date | datetime) -> bool:
    if sent is None:  # not sent yet: no send date to filter on
        return False
    value: date | datetime = sent if isinstance(bound, datetime) else sent.date()
    if key == "DateSent>":
        return value >= bound
    if key == "DateSent<":
        return value <= bound
    return value == bound


async def _until_gone(request: web.Request, seconds: float | None) -> None:
    """Wait ``seconds`` (None: for ever), or until the client has closed the connection."""
    loop = asyncio.get_running_loop()
    deadline = None if seconds is None else loop.time() + seconds
    while request.transport is not None and not request.transport.is_closing():
        if deadline is not None and loop.time() >= deadline:
            return
        await asyncio.sleep(_POLL)
