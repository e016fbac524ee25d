"""A local Twilio Messages API: `POST /2010-04-01/Accounts/{Sid}/Messages.json`, scriptable."""

from __future__ import annotations

import asyncio
import base64
import binascii
import email.utils
import uuid
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from aiohttp import web

MAX_BODY = 1600
_POLL = 0.01

_MESSAGES = {
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
    63016: "Failed to send freeform message because you are outside the allowed window.",
}


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
    fail_next: list[Failure | tuple[Any, ...]] = field(default_factory=list)
    succeed_first: int = 0  # messages to accept before `fail_next` is served
    hang: bool = False  # requests are never answered (until the client gives up)
    # Accepted messages, in order: {"sid", "to", "from", "body", "status_callback", "status"}.
    messages: list[dict[str, Any]] = field(default_factory=list)
    # Every request to the Messages route, accepted or not: {"form", "status", "code"}.
    requests: list[dict[str, Any]] = field(default_factory=list)

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/2010-04-01/Accounts/{sid}/Messages.json", self._create)
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

    async def _create(self, request: web.Request) -> web.StreamResponse:
        form = {k: str(v) for k, v in (await request.post()).items()}
        if self.hang:
            while request.transport is not None and not request.transport.is_closing():
                await asyncio.sleep(_POLL)
            return self._answer(form, web.Response(status=499), None)
        if not self._authorized(request):
            return self._answer(form, _error(401, 20003), 20003)
        if request.match_info["sid"] != self.account_sid:
            return self._answer(form, _error(404, 20404), 20404)
        if self.fail_next and len(self.messages) >= self.succeed_first:
            failure = Failure(*self.fail_next.pop(0))
            headers = {"Retry-After": failure.retry_after} if failure.retry_after else None
            response = _error(failure.status, failure.code, headers)
            return self._answer(form, response, failure.code)
        for name, code in (("To", 21604), ("From", 21603), ("Body", 21602)):
            if not form.get(name):
                return self._answer(form, _error(400, code), code)
        if len(form["Body"]) > MAX_BODY:
            return self._answer(form, _error(400, 21617), 21617)
        now = email.utils.formatdate(usegmt=True)
        sid = _sid("SM")
        message = {
            "account_sid": self.account_sid,
            "api_version": "2010-04-01",
            "body": form["Body"],
            "date_created": now,
            "date_sent": None,
            "date_updated": now,
            "direction": "outbound-api",
            "error_code": None,
            "error_message": None,
            "from": form["From"],
            "messaging_service_sid": None,
            "num_media": "0",
            "num_segments": "1",
            "price": None,
            "price_unit": "USD",
            "sid": sid,
            "status": "queued",
            "subresource_uris": {
                "media": f"/2010-04-01/Accounts/{self.account_sid}/Messages/{sid}/Media.json"
            },
            "to": form["To"],
            "uri": f"/2010-04-01/Accounts/{self.account_sid}/Messages/{sid}.json",
        }
        self.messages.append(
            {
                "sid": sid,
                "to": form["To"],
                "from": form["From"],
                "body": form["Body"],
                "status_callback": form.get("StatusCallback"),
                "status": "queued",
            }
        )
        return self._answer(form, web.json_response(message, status=201), None)
