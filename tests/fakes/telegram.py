"""A local Telegram Bot API: getMe, sendMessage (with inline keyboards), sendChatAction,
answerCallbackQuery, the webhook and getUpdates.

Scriptable: failures to serve, blocked chats, and updates a test pushes for long polling.
"""

from __future__ import annotations

import asyncio
import contextlib
import html
import json
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


def _json_param(value: Any) -> Any:
    """A nested value: PTB sends it as a JSON string in a form field."""
    return json.loads(value) if isinstance(value, str) else value


def _inline_keyboard(markup: Any) -> tuple[list[list[dict[str, Any]]] | None, str]:
    """The rows of buttons of a ``reply_markup``, checked as Telegram checks them (a button's
    ``callback_data`` is 1-64 bytes), or the complaint."""
    if markup is None:
        return None, ""
    rows = _json_param(markup).get("inline_keyboard")
    if not isinstance(rows, list):
        return None, ""  # another kind of keyboard: not looked at here
    for row in rows:
        for button in row:
            data = button.get("callback_data")
            if data is not None and not 1 <= len(str(data).encode()) <= 64:
                return None, "Bad Request: BUTTON_DATA_INVALID"
            if not str(button.get("text") or "").strip():
                return None, "Bad Request: text buttons are unallowed in the inline keyboard"
    return rows, ""


def _gone(request: web.Request) -> bool:
    return request.transport is None or request.transport.is_closing()


def _flag(value: Any) -> bool:
    return str(value).lower() == "true"


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
    # Accepted messages are recorded at once but answered this many seconds later (or not at
    # all when the client has gone by then): an answer lost after Telegram took the message.
    answer_late_by: float = 0.0
    # The webhook as setWebhook left it: {"url", "secret_token", "allowed_updates",
    # "max_connections", "drop_pending_updates"}; None when there is none.
    webhook: dict[str, Any] | None = None
    # Updates not yet confirmed (getUpdates confirms those below its ``offset``); `push` adds.
    # ``allowed_updates`` is recorded, not applied, so the bot sees whatever a test pushes.
    pending: list[dict[str, Any]] = field(default_factory=list)
    # Every call with a valid token, in order: {"method", "params"}.
    calls: list[dict[str, Any]] = field(default_factory=list)
    # Accepted messages: {"message_id", "chat_id", "text" (as shown), "sent" (as sent),
    # "parse_mode", "buttons": rows of {"text", "callback_data"} of an inline keyboard}.
    messages: list[dict[str, Any]] = field(default_factory=list)
    # Button presses answered (answerCallbackQuery): {"callback_query_id", "text"}.
    answered_callbacks: list[dict[str, Any]] = field(default_factory=list)
    # Files customers sent, by file_id: (bytes, file_path); getFile and the download serve them.
    files: dict[str, tuple[bytes, str]] = field(default_factory=dict)
    downloads: list[str] = field(default_factory=list)  # file paths fetched
    _changed: asyncio.Condition = field(default_factory=asyncio.Condition, init=False, repr=False)

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_route("*", "/bot{token}/{method}", self._dispatch)
        app.router.add_get("/file/bot{token}/{path:.+}", self._file)
        return app

    async def _file(self, request: web.Request) -> web.Response:
        if request.match_info["token"] != self.token:
            return web.Response(status=401)
        path = request.match_info["path"]
        found = next((data for data, at in self.files.values() if at == path), None)
        if found is None:
            return web.Response(status=404)
        self.downloads.append(path)
        return web.Response(body=found)

    def _get_file(self, params: dict[str, Any]) -> web.Response:
        file_id = str(params.get("file_id", ""))
        if file_id not in self.files:
            return _error(Failure(400, "Bad Request: invalid file_id"))
        data, path = self.files[file_id]
        result = {
            "file_id": file_id,
            "file_unique_id": "u" + file_id,
            "file_size": len(data),
            "file_path": path,
        }
        return web.json_response({"ok": True, "result": result})

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

    async def push(self, *updates: dict[str, Any]) -> None:
        """Queue updates (the Bot API's JSON) for getUpdates; a waiting long poll returns."""
        async with self._changed:
            self.pending.extend(updates)
            self._changed.notify_all()

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
        if method.lower() == "getupdates":
            return await self._get_updates(request, params)
        handler = {
            "getme": self._get_me,
            "getfile": self._get_file,
            "sendmessage": self._send_message,
            "sendchataction": self._send_chat_action,
            "answercallbackquery": self._answer_callback_query,
            "setwebhook": self._set_webhook,
            "getwebhookinfo": self._get_webhook_info,
            "deletewebhook": self._delete_webhook,
        }.get(method.lower())
        if handler is None:
            return _error(Failure(404, "Not Found"))
        response = handler(params)
        if method.lower() == "sendmessage" and response.status == 200 and self.answer_late_by:
            loop = asyncio.get_running_loop()
            deadline = loop.time() + self.answer_late_by
            while loop.time() < deadline and not _gone(request):
                await asyncio.sleep(0.01)
        return response

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
        buttons, complaint = _inline_keyboard(params.get("reply_markup"))
        if complaint:
            return _error(Failure(400, complaint))
        message_id = len(self.messages) + 1
        self.messages.append(
            {
                "message_id": message_id,
                "chat_id": chat_id,
                "text": shown,
                "sent": sent,
                "parse_mode": parse_mode,
                "buttons": buttons,
            }
        )
        result = {
            "message_id": message_id,
            "from": self._user(),
            "chat": {"id": chat_id, "type": "private", "first_name": "Customer"},
            "date": int(time.time()),
            "text": shown,
        }
        if buttons:
            result["reply_markup"] = {"inline_keyboard": buttons}
        return web.json_response({"ok": True, "result": result})

    def _answer_callback_query(self, params: dict[str, Any]) -> web.Response:
        query_id = str(params.get("callback_query_id") or "")
        if not query_id:
            return _error(
                Failure(400, "Bad Request: query is too old and response timeout expired")
            )
        self.answered_callbacks.append({"callback_query_id": query_id, "text": params.get("text")})
        return web.json_response({"ok": True, "result": True})

    def _send_chat_action(self, params: dict[str, Any]) -> web.Response:
        failure = self._scripted(self.action_fail_next, int(params["chat_id"]))
        if failure is not None:
            return _error(failure)
        if params.get("action") not in {"typing", "upload_photo", "record_voice"}:
            return _error(Failure(400, "Bad Request: wrong parameter action in request"))
        return web.json_response({"ok": True, "result": True})

    async def _get_updates(self, request: web.Request, params: dict[str, Any]) -> web.Response:
        """Long polling: what is pending from ``offset`` on, else wait up to ``timeout`` s."""
        if self.webhook is not None:
            return _error(
                Failure(
                    409,
                    "Conflict: can't use getUpdates method while webhook is active; "
                    "use deleteWebhook to delete the webhook first",
                )
            )
        offset = int(params.get("offset") or 0)
        limit = int(params.get("limit") or 100)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + float(params.get("timeout") or 0)
        async with self._changed:
            while True:
                if offset:  # Telegram forgets updates below the offset: they are confirmed
                    self.pending = [u for u in self.pending if u["update_id"] >= offset]
                gone = request.transport is None or request.transport.is_closing()
                remaining = deadline - loop.time()
                if self.pending or remaining <= 0 or gone:
                    break
                # Short waits, so a poll whose client went away does not hold the server open.
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._changed.wait(), timeout=min(remaining, 0.2))
            result = self.pending[:limit]
        return web.json_response({"ok": True, "result": result})

    def _set_webhook(self, params: dict[str, Any]) -> web.Response:
        url = str(params.get("url", ""))
        if not url:
            return self._delete_webhook(params)
        if not url.startswith("https://"):
            return _error(
                Failure(400, "Bad Request: bad webhook: An HTTPS URL must be provided for webhook")
            )
        if _flag(params.get("drop_pending_updates")):
            self.pending.clear()
        self.webhook = {
            "url": url,
            "secret_token": params.get("secret_token"),
            "allowed_updates": _json_param(params.get("allowed_updates")),
            "max_connections": int(params.get("max_connections") or 40),
            "drop_pending_updates": _flag(params.get("drop_pending_updates")),
        }
        return web.json_response({"ok": True, "result": True, "description": "Webhook was set"})

    def _get_webhook_info(self, params: dict[str, Any]) -> web.Response:
        info: dict[str, Any] = {
            "url": "",
            "has_custom_certificate": False,
            "pending_update_count": len(self.pending),
        }
        if self.webhook is not None:
            info |= {
                "url": self.webhook["url"],
                "max_connections": self.webhook.get("max_connections") or 40,
                "allowed_updates": self.webhook.get("allowed_updates") or ["message"],
            }
        return web.json_response({"ok": True, "result": info})

    def _delete_webhook(self, params: dict[str, Any]) -> web.Response:
        existed, self.webhook = self.webhook is not None, None
        if _flag(params.get("drop_pending_updates")):
            self.pending.clear()
        description = "Webhook was deleted" if existed else "Webhook is already deleted"
        return web.json_response({"ok": True, "result": True, "description": description})
