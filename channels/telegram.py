"""Telegram, inbound: check the secret header, write the inbox row, answer ``{}`` at once.

Modelled on python-telegram-bot's own webhook handler: 403 unless the request is JSON and
carries the secret given to ``setWebhook``; then parse, hand over, 200. The reply is sent
later by a worker (`channels.telegram_send`); a re-delivered ``update_id`` is a no-op.
"""

from __future__ import annotations

import hmac
import json
import logging
from dataclasses import dataclass
from typing import Any, Literal

from aiohttp import web
from telegram import Message, Update
from telegram.constants import ChatType

from channels.credentials import ChannelNotConfigured, telegram_credentials
from core.errors import Forbidden, InvalidInput
from core.settings import Settings
from core.store.agents import Agent, Agents
from core.store.inbox import Inbox
from core.turns import clean_payload

log = logging.getLogger(__name__)

CHANNEL = "telegram"
SECRET_HEADER = "X-Telegram-Bot-Api-Secret-Token"  # noqa: S105 (a header name)
# What a visitor can send besides text; answered (with "please type your question") in
# private chats only: in a group, a photo is rarely meant for the bot.
_MEDIA = ("photo", "sticker", "voice", "audio", "video", "video_note", "animation", "document")


def _kind(data: dict[str, Any]) -> str:
    """The update's type as Telegram names it (``edited_message``, ``callback_query``, ...)."""
    return next((key for key in data if key != "update_id"), "empty")


def _classify(update: Update, data: dict[str, Any]) -> tuple[Message | None, bool, str]:
    """(the message to store or None, media_only, kind for the log)."""
    message = update.message
    if message is None:
        return None, False, _kind(data)
    if message.text:
        return message, False, "command" if message.text.startswith("/") else "text"
    media = next((name for name in _MEDIA if getattr(message, name)), None)
    if media is None:
        return None, False, "service"  # joins, leaves, pins, title changes, ...
    if message.chat.type != ChatType.PRIVATE:
        return None, False, f"group_{media}"
    return message, not (message.caption or "").strip(), media


@dataclass(frozen=True, slots=True)
class Handled:
    """What became of one Update: stored, already stored, or ignored, and its kind for logs."""

    outcome: Literal["stored", "duplicate", "ignored"]
    update_id: int
    kind: str


async def store_update(inbox: Inbox, agent: Agent, data: dict[str, Any]) -> Handled:
    """Write one Update (the Bot API's JSON) to the inbox when it needs an answer.

    The webhook and `parley telegram poll` both come here, so a row is the same however it
    arrived, keyed by ``update_id``: the same update read twice is stored once.
    `InvalidInput` when ``data`` is not an Update.
    """
    data = clean_payload(data)  # a "\u0000" anywhere would make the jsonb row fail
    try:
        update = Update.de_json(data, bot=None)
    except (KeyError, TypeError, ValueError) as exc:
        raise InvalidInput(f"not a Telegram Update ({type(exc).__name__})") from None
    message, media_only, kind = _classify(update, data)
    if message is None:
        return Handled("ignored", update.update_id, kind)
    added = await inbox.add(
        agent.id,
        CHANNEL,
        str(update.update_id),
        str(message.chat.id),
        {**data, "media_only": media_only},
    )
    return Handled("stored" if added else "duplicate", update.update_id, kind)


class TelegramChannel:
    def __init__(self, agents: Agents, inbox: Inbox, settings: Settings) -> None:
        self._agents = agents
        self._inbox = inbox
        self._settings = settings

    async def webhook(self, request: web.Request) -> web.Response:
        """``POST /webhooks/telegram/{agent}``: one Update from the Bot API."""
        agent = await self._agents.get(request.match_info["agent"])
        self._verify(agent, request)
        handled = await store_update(self._inbox, agent, _json_object(await request.read()))
        if handled.outcome == "ignored":
            log.info("telegram.webhook.ignored agent=%s kind=%s", agent.slug, handled.kind)
        else:
            log.info(
                "telegram.webhook.%s agent=%s update_id=%d kind=%s",
                handled.outcome,
                agent.slug,
                handled.update_id,
                handled.kind,
            )
        return web.json_response({})

    def _verify(self, agent: Agent, request: web.Request) -> None:
        """403 unless the request is JSON with the agent's secret, checked before parsing."""
        try:
            secret = telegram_credentials(agent, self._settings).webhook_secret
        except ChannelNotConfigured:
            log.warning("telegram.webhook.rejected agent=%s reason=not_configured", agent.slug)
            raise
        given = request.headers.get(SECRET_HEADER, "")
        reason = None
        if request.content_type != "application/json":
            reason = "content_type"
        elif not hmac.compare_digest(
            given.encode(errors="replace"), secret.get_secret_value().encode()
        ):
            reason = "missing_secret" if not given else "wrong_secret"
        if reason is not None:
            log.warning("telegram.webhook.rejected agent=%s reason=%s", agent.slug, reason)
            raise Forbidden(f"not a webhook call from Telegram ({reason})")


def _json_object(raw: bytes) -> dict[str, Any]:
    try:
        data = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise InvalidInput("the body is not valid JSON") from None
    if not isinstance(data, dict):
        raise InvalidInput("a Telegram Update is a JSON object")
    return data
