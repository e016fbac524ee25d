"""A local WhatsApp Cloud API (Graph API): messages, media, and webhooks signed the way Meta does.

Routes: ``POST /{version}/{phone_number_id}/messages`` (text, template, read + typing),
``GET /{version}/{media_id}`` (the media's URL, type and size; for the phone number id, the
number's display number and verified name) and ``GET /media/{media_id}`` (the download). Every route wants ``Authorization: Bearer <access_token>`` (401 with Meta's
error JSON otherwise). Failures are scripted per test: `Failure` entries in ``fail_next``
are served one per ``/messages`` call, in order.

`signed` builds the headers Meta sends with a webhook: ``X-Hub-Signature-256`` over the exact
bytes that are posted.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import secrets
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from aiohttp import web

MAX_TEXT = 4096
VERSION = "v21.0"

_MESSAGES = {
    4: "(#4) Application request limit reached",
    100: "(#100) Invalid parameter",
    190: "Invalid OAuth access token - Cannot parse access token",
    131000: "Something went wrong",
    131026: "Message undeliverable",
    131047: "Re-engagement message",
    131051: "Unsupported message type",
    131056: "(Business Account, Consumer Account) pair rate limit hit",
    130429: "Rate limit hit",
    132001: "Template name does not exist in the translation",
}


class Failure(NamedTuple):
    """One scripted error answer: Meta's error ``code``, the HTTP ``status``, a Retry-After
    header when given, and ``delay`` seconds before it is answered."""

    code: int
    status: int = 400
    retry_after: str | None = None
    delay: float = 0.0


RE_ENGAGEMENT = Failure(131047, 400)
THROTTLED = Failure(130429, 429, "7")


def error_body(code: int, *, subcode: int | None = None) -> dict[str, Any]:
    """Meta's error JSON for ``code``."""
    error: dict[str, Any] = {
        "message": _MESSAGES.get(code, "An unknown error occurred"),
        "type": "OAuthException",
        "code": code,
        "error_data": {"messaging_product": "whatsapp", "details": _MESSAGES.get(code, "")},
        "fbtrace_id": "A" + secrets.token_hex(8),
    }
    if subcode is not None:
        error["error_subcode"] = subcode
    return {"error": error}


def _error(failure: Failure) -> web.Response:
    headers = {"Retry-After": failure.retry_after} if failure.retry_after else None
    return web.json_response(error_body(failure.code), status=failure.status, headers=headers)


def _wamid() -> str:
    return "wamid.HBgL" + secrets.token_hex(24).upper()


@dataclass
class Media:
    """A file a customer sent, as the fake serves it."""

    data: bytes
    mime_type: str = "audio/ogg; codecs=opus"
    # Where the media's URL says the file is; by default this fake's own ``/media/{id}``
    # (a test points it at another host, as Meta's CDN is).
    url: str | None = None


@dataclass
class FakeMeta:
    """State of the fake: what it accepts, failures to serve first, what it was asked."""

    access_token: str = "EAAGfakeMetaAccessToken0123456789abcdefZZ"
    phone_number_id: str = "106540352242922"
    display_phone_number: str = "+31 10 555 0100"
    verified_name: str = "Noordkaap Outdoor"
    app_secret: str = "fake-meta-app-secret-6d1e0c"
    version: str = VERSION
    # Served to /messages calls, one each, in order, before calls succeed again.
    fail_next: list[Failure | tuple[Any, ...]] = field(default_factory=list)
    # Seconds every /messages call waits before it is answered (after it is recorded).
    delay: float = 0.0
    # Files customers sent, by media id.
    media: dict[str, Media] = field(default_factory=dict)
    # Every request with a valid token: {"method", "path", "json" (or None), "status"}.
    requests: list[dict[str, Any]] = field(default_factory=list)
    # Accepted text and template messages: {"id", "to", "type", "body" (the JSON as sent)}.
    messages: list[dict[str, Any]] = field(default_factory=list)
    # Accepted read receipts: {"message_id", "typing" (the typing_indicator or None)}.
    reads: list[dict[str, Any]] = field(default_factory=list)
    # Requests refused for their token: {"method", "path", "authorization"}.
    unauthorized: list[dict[str, Any]] = field(default_factory=list)

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/{version}/{number}/messages", self._messages)
        app.router.add_get("/media/{media_id}", self._download)
        app.router.add_get("/{version}/{media_id}", self._media_info)
        return app

    @property
    def texts(self) -> list[str]:
        return [m["body"]["text"]["body"] for m in self.messages if m["type"] == "text"]

    def _authorized(self, request: web.Request) -> bool:
        given = request.headers.get("Authorization", "")
        if hmac.compare_digest(given.encode(), f"Bearer {self.access_token}".encode()):
            return True
        self.unauthorized.append(
            {"method": request.method, "path": request.path, "authorization": given}
        )
        return False

    def _record(self, request: web.Request, body: Any, status: int) -> None:
        self.requests.append(
            {"method": request.method, "path": request.path, "json": body, "status": status}
        )

    async def _messages(self, request: web.Request) -> web.Response:
        if not self._authorized(request):
            return _error(Failure(190, 401))
        try:
            body = await request.json()
        except ValueError:
            body = None
        response = self._answer(request, body)
        self._record(request, body, response.status)
        failure = None
        if self.fail_next and response.status == 200:
            failure = Failure(*self.fail_next.pop(0))
            response = _error(failure)
            self.requests[-1]["status"] = failure.status
        delay = self.delay + (failure.delay if failure is not None else 0.0)
        if delay:
            await asyncio.sleep(delay)
        if failure is None:
            self._keep(body, response)
        return response

    def _answer(self, request: web.Request, body: Any) -> web.Response:
        """What Meta would answer, before anything is kept."""
        if request.match_info["version"] != self.version:
            return _error(Failure(100, 400))
        if request.match_info["number"] != self.phone_number_id:
            return _error(Failure(100, 400))
        if not isinstance(body, dict) or body.get("messaging_product") != "whatsapp":
            return _error(Failure(100, 400))
        if body.get("status") == "read":
            if not str(body.get("message_id") or "").startswith("wamid."):
                return _error(Failure(100, 400))
            return web.json_response({"success": True})
        if not body.get("to"):
            return _error(Failure(100, 400))
        kind = body.get("type")
        if kind == "text":
            text = (body.get("text") or {}).get("body")
            if not isinstance(text, str) or not text.strip() or len(text) > MAX_TEXT:
                return _error(Failure(100, 400))
        elif kind == "template":
            template = body.get("template") or {}
            if not template.get("name") or not (template.get("language") or {}).get("code"):
                return _error(Failure(100, 400))
        else:
            return _error(Failure(131051, 400))
        wamid = _wamid()
        return web.json_response(
            {
                "messaging_product": "whatsapp",
                "contacts": [{"input": body["to"], "wa_id": body["to"]}],
                "messages": [{"id": wamid, "message_status": "accepted"}],
            }
        )

    def _keep(self, body: dict[str, Any], response: web.Response) -> None:
        """Record what an accepted call did."""
        if body.get("status") == "read":
            self.reads.append(
                {"message_id": body["message_id"], "typing": body.get("typing_indicator")}
            )
            return
        assert response.text is not None
        wamid = json.loads(response.text)["messages"][0]["id"]
        self.messages.append({"id": wamid, "to": body["to"], "type": body["type"], "body": body})

    async def _media_info(self, request: web.Request) -> web.Response:
        if not self._authorized(request):
            return _error(Failure(190, 401))
        media_id = request.match_info["media_id"]
        if media_id == self.phone_number_id and request.match_info["version"] == self.version:
            self._record(request, None, 200)
            return web.json_response(
                {
                    "display_phone_number": self.display_phone_number,
                    "verified_name": self.verified_name,
                    "id": self.phone_number_id,
                }
            )
        self._record(request, None, 200 if media_id in self.media else 400)
        if request.match_info["version"] != self.version or media_id not in self.media:
            return _error(Failure(100, 400))
        media = self.media[media_id]
        return web.json_response(
            {
                "messaging_product": "whatsapp",
                "url": media.url
                or str(request.url.with_path(f"/media/{media_id}").with_query(None)),
                "mime_type": media.mime_type,
                "sha256": hashlib.sha256(media.data).hexdigest(),
                "file_size": len(media.data),
                "id": media_id,
            }
        )

    async def _download(self, request: web.Request) -> web.Response:
        if not self._authorized(request):
            return _error(Failure(190, 401))
        media = self.media.get(request.match_info["media_id"])
        self._record(request, None, 200 if media else 404)
        if media is None:
            return web.Response(status=404)
        return web.Response(body=media.data, content_type=media.mime_type.split(";")[0])


# -- webhooks, as Meta sends them -------------------------------------------------------------


def signature(body: bytes, app_secret: str) -> str:
    """``X-Hub-Signature-256``: HMAC-SHA256 of the body's bytes under the app secret."""
    return "sha256=" + hmac.new(app_secret.encode(), body, hashlib.sha256).hexdigest()


def encode(payload: dict[str, Any], *, ascii_only: bool = True) -> bytes:
    """A notification's bytes. Meta escapes non-ASCII characters (``\\u00e9``); with
    ``ascii_only=False`` they are sent as UTF-8, which a re-serialising receiver gets wrong."""
    return json.dumps(payload, ensure_ascii=ascii_only, separators=(",", ":")).encode()


def signed(body: bytes, app_secret: str) -> dict[str, str]:
    """The headers Meta sends with ``body`` (which must be posted byte for byte)."""
    return {"Content-Type": "application/json", "X-Hub-Signature-256": signature(body, app_secret)}


def text_message(
    wamid: str, sender: str, text: str, *, timestamp: str = "1717000000"
) -> dict[str, Any]:
    return {
        "from": sender,
        "id": wamid,
        "timestamp": timestamp,
        "type": "text",
        "text": {"body": text},
    }


def media_message(
    wamid: str, sender: str, kind: str, media_id: str, mime_type: str, **extra: Any
) -> dict[str, Any]:
    return {
        "from": sender,
        "id": wamid,
        "timestamp": "1717000000",
        "type": kind,
        kind: {"id": media_id, "mime_type": mime_type, "sha256": "abc", **extra},
    }


def contact(wa_id: str, name: str) -> dict[str, Any]:
    return {"profile": {"name": name}, "wa_id": wa_id}


def status(
    wamid: str, state: str, recipient: str, *, error_code: int | None = None
) -> dict[str, Any]:
    report: dict[str, Any] = {
        "id": wamid,
        "status": state,
        "timestamp": "1717000100",
        "recipient_id": recipient,
    }
    if error_code is not None:
        report["errors"] = [{"code": error_code, "title": _MESSAGES.get(error_code, "Error")}]
    return report


def change(
    phone_number_id: str,
    *,
    messages: Sequence[dict[str, Any]] = (),
    contacts: Sequence[dict[str, Any]] = (),
    statuses: Sequence[dict[str, Any]] = (),
    display_phone_number: str = "15550783881",
) -> dict[str, Any]:
    """One ``messages`` change, as an entry's ``changes[]`` holds it."""
    value: dict[str, Any] = {
        "messaging_product": "whatsapp",
        "metadata": {
            "display_phone_number": display_phone_number,
            "phone_number_id": phone_number_id,
        },
    }
    if contacts:
        value["contacts"] = list(contacts)
    if messages:
        value["messages"] = list(messages)
    if statuses:
        value["statuses"] = list(statuses)
    return {"field": "messages", "value": value}


def notification(
    *entries: list[dict[str, Any]], account: str = "102290129340398"
) -> dict[str, Any]:
    """A webhook notification; each argument is one entry's list of changes."""
    return {
        "object": "whatsapp_business_account",
        "entry": [{"id": account, "changes": changes} for changes in entries],
    }
