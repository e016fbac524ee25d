"""Telegram, inbound: check the secret header, write the inbox row, answer ``{}`` at once.

Modelled on python-telegram-bot's own webhook handler: 403 unless the request is JSON and
carries the secret given to ``setWebhook``; then parse, hand over, 200. The body is read by
`channels.inbound` and the Update checked against the Bot API's types for what is read of
it, so a malformed one is a 400 that stores nothing. The reply is sent later by a worker
(`channels.telegram_send`); a re-delivered ``update_id`` is a no-op.
"""

from __future__ import annotations

import hmac
import logging
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field, StrictInt, StrictStr
from telegram.constants import ChatType, MessageLimit

from channels.credentials import ChannelNotConfigured, telegram_credentials
from channels.inbound import find_agent, read_json, validated
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


# Telegram's identifiers fit 52 bits; anything beyond a bigint is not from Telegram.
_Id = Annotated[StrictInt, Field(ge=-(2**63) + 1, le=2**63 - 1)]
_Text = Annotated[StrictStr, Field(max_length=MessageLimit.MAX_TEXT_LENGTH)]


class _Shape(BaseModel):
    """The parts of an Update that are read here or by the worker, with their Bot API types.
    Telegram adds fields without notice: the others are not checked, and the row keeps the
    Update as sent."""

    model_config = ConfigDict(extra="ignore", frozen=True)


class TelegramChat(_Shape):
    id: _Id
    type: StrictStr


class TelegramUser(_Shape):
    id: _Id
    language_code: StrictStr | None = Field(None, max_length=35)


class TelegramMessage(_Shape):
    message_id: _Id
    date: _Id  # Unix time
    chat: TelegramChat
    sender: TelegramUser | None = Field(None, alias="from")
    text: _Text | None = None
    caption: _Text | None = None
    photo: list[dict[str, Any]] | None = None
    sticker: dict[str, Any] | None = None
    voice: dict[str, Any] | None = None
    audio: dict[str, Any] | None = None
    video: dict[str, Any] | None = None
    video_note: dict[str, Any] | None = None
    animation: dict[str, Any] | None = None
    document: dict[str, Any] | None = None


class TelegramUpdate(_Shape):
    """One Update; only ``message`` is answered, every other kind is acknowledged unread."""

    update_id: Annotated[StrictInt, Field(ge=0, le=2**63 - 1)]
    message: TelegramMessage | None = None


def _kind(data: dict[str, Any]) -> str:
    """The update's type as Telegram names it (``edited_message``, ``callback_query``, ...)."""
    return next((key for key in data if key != "update_id"), "empty")


def _classify(
    update: TelegramUpdate, data: dict[str, Any]
) -> tuple[TelegramMessage | None, bool, str]:
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
    update = validated(TelegramUpdate, data, "not a Telegram Update: ")
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
        agent = await find_agent(self._agents, request.match_info["agent"])
        self._verify(agent, request)
        handled = await store_update(self._inbox, agent, _json_object(await read_json(request)))
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


def _json_object(data: Any) -> dict[str, Any]:
    if not isinstance(data, dict):
        raise InvalidInput("a Telegram Update is a JSON object")
    return data
