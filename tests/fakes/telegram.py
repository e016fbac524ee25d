"""A local Telegram Bot API: `/bot{token}/getMe`, `/sendMessage`, `/sendChatAction`, scriptable."""

from __future__ import annotations

import asyncio
import html
import re
import time
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from aiohttp import web

MAX_TEXT = 4096

# What Telegram's HTML parse mode accepts; anything else starting with `<` or `&` is refused.
_TAG = re.compile(
    r"</?(?:b|strong|i|em|u|ins|s|strike|del|code|pre|tg-spoiler|blockquote|a|span|tg-emoji)"
    r"(?:\s[^<>]*)?>"
)
_ENTITY = re.compile(r"&(?:lt|gt|amp|quot|#[0-9]+|#x[0-9a-fA-F]+);")


class Failure(NamedTuple):
    """One scripted error answer, e.g. ``(403, "Forbidden: bot was blocked by the user")``."""

    status: int
    description: str
    retry_after: int | None = None


CANT_PARSE = Failure(
    400, "Bad Request: can't parse entities: Unsupported start tag at byte offset 0"
)
BLOCKED = Failure(403, "Forbidden: bot was blocked by the user")


def flood(retry_after: int) -> Failure:
    return Failure(429, f"Too Many Requests: retry after {retry_after}", retry_after)


def _error(failure: Failure) -> web.Response:
    body: dict[str, Any] = {
        "ok": False,
        "error_code": failure.status,
        "description": failure.description,
    }
    if failure.retry_after is not None:
        body["parameters"] = {"retry_after": failure.retry_after}
    return web.json_response(body, status=failure.status)


def _parse_html(text: str) -> tuple[str | None, str]:
    """The text a user would see, or None and Telegram's complaint when it does not parse."""
    without_tags = _TAG.sub("", text)
    for match in re.finditer(r"[<&]", without_tags):
        if match.group() == "<":
            return None, "Bad Request: can't parse entities: Unsupported start tag"
        if not _ENTITY.match(without_tags, match.start()):
            return None, "Bad Request: can't parse entities: Character entity expected"
    return html.unescape(without_tags), ""


@dataclass
class FakeTelegram:
    """State of the fake: the token it accepts, failures to serve first, what it was asked.

    ``fail_next`` is served to sendMessage calls, ``action_fail_next`` to sendChatAction,
    one entry per call, before calls succeed again; chats in ``blocked`` always answer 403.
    """

    token: str = "123456789:AAFakeTelegramTokenForParleyTests_x"
    fail_next: list[Failure | tuple[Any, ...]] = field(default_factory=list)
    action_fail_next: list[Failure | tuple[Any, ...]] = field(default_factory=list)
    succeed_first: int = 0  # messages to accept before `fail_next` is served
    blocked: set[int] = field(default_factory=set)
    # Every call with a valid token, in order: {"method", "params"}.
    calls: list[dict[str, Any]] = field(default_factory=list)
    # Accepted messages: {"message_id", "chat_id", "text" (as shown), "sent" (as sent),
    # "parse_mode"}.
    messages: list[dict[str, Any]] = field(default_factory=list)
    _changed: asyncio.Condition = field(default_factory=asyncio.Condition, init=False, repr=False)

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_route("*", "/bot{token}/{method}", self._dispatch)
        return app

    @property
    def bot_id(self) -> int:
        return int(self.token.partition(":")[0])

    @property
    def texts(self) -> list[str]:
        return [m["text"] for m in self.messages]

    def count(self, method: str) -> int:
        return sum(1 for call in self.calls if call["method"] == method)

    async def wait_for(self, method: str, count: int) -> None:
        """Return once ``method`` has been called ``count`` times."""
        async with self._changed:
            await self._changed.wait_for(lambda: self.count(method) >= count)

    async def _params(self, request: web.Request) -> dict[str, Any]:
        if not request.body_exists:
            return dict(request.query)
        if request.content_type == "application/json":
            body = await request.json()
            return dict(body)
        # PTB sends form fields; nested values arrive as JSON strings.
        return {k: str(v) for k, v in (await request.post()).items()}

    async def _dispatch(self, request: web.Request) -> web.Response:
        if request.match_info["token"] != self.token:
            return _error(Failure(401, "Unauthorized"))
        method = request.match_info["method"]
        params = await self._params(request)
        async with self._changed:
            self.calls.append({"method": method, "params": params})
            self._changed.notify_all()
        handler = {
            "getme": self._get_me,
            "sendmessage": self._send_message,
            "sendchataction": self._send_chat_action,
        }.get(method.lower())
        if handler is None:
            return _error(Failure(404, "Not Found"))
        return handler(params)

    def _user(self) -> dict[str, Any]:
        return {
            "id": self.bot_id,
            "is_bot": True,
            "first_name": "Parley Test",
            "username": "parley_test_bot",
            "can_join_groups": True,
            "can_read_all_group_messages": False,
            "supports_inline_queries": False,
        }

    def _get_me(self, params: dict[str, Any]) -> web.Response:
        return web.json_response({"ok": True, "result": self._user()})

    def _scripted(self, queue: list[Failure | tuple[Any, ...]], chat_id: int) -> Failure | None:
        if queue:
            return Failure(*queue.pop(0))
        if chat_id in self.blocked:
            return BLOCKED
        return None

    def _send_message(self, params: dict[str, Any]) -> web.Response:
        chat_id = int(params["chat_id"])
        queue = self.fail_next if len(self.messages) >= self.succeed_first else []
        failure = self._scripted(queue, chat_id)
        if failure is not None:
            return _error(failure)
        sent = str(params.get("text", ""))
        parse_mode = params.get("parse_mode")
        shown = sent
        if parse_mode == "HTML":
            parsed, complaint = _parse_html(sent)
            if parsed is None:
                return _error(Failure(400, complaint))
            shown = parsed
        if not shown.strip():
            return _error(Failure(400, "Bad Request: message text is empty"))
        if len(shown) > MAX_TEXT:
            return _error(Failure(400, "Bad Request: message is too long"))
        message_id = len(self.messages) + 1
        self.messages.append(
            {
                "message_id": message_id,
                "chat_id": chat_id,
                "text": shown,
                "sent": sent,
                "parse_mode": parse_mode,
            }
        )
        result = {
            "message_id": message_id,
            "from": self._user(),
            "chat": {"id": chat_id, "type": "private", "first_name": "Customer"},
            "date": int(time.time()),
            "text": shown,
        }
        return web.json_response({"ok": True, "result": result})

    def _send_chat_action(self, params: dict[str, Any]) -> web.Response:
        failure = self._scripted(self.action_fail_next, int(params["chat_id"]))
        if failure is not None:
            return _error(failure)
        if params.get("action") not in {"typing", "upload_photo", "record_voice"}:
            return _error(Failure(400, "Bad Request: wrong parameter action in request"))
        return web.json_response({"ok": True, "result": True})
