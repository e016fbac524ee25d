"""Telegram, inbound: check the secret header, write the inbox row, answer ``{}`` at once.

Modelled on python-telegram-bot's own webhook handler: 403 unless the request is JSON and
carries the secret given to ``setWebhook``; then parse, hand over, 200. Wrong secrets spend
the sending address's budget (`core.wrong_secrets`): past it, 429 with ``Retry-After``; the
right secret is never counted, so Telegram is not held back by anyone's guessing. The body
is read by `channels.inbound` and the Update checked against the Bot API's types for what is
read of it, so a malformed one is a 400 that stores nothing. The reply is sent later by a worker
(`channels.telegram_send`); a re-delivered ``update_id`` is a no-op.
"""

from __future__ import annotations

import hmac
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Annotated, Any, Literal

import aiohttp
from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field, StrictInt, StrictStr
from telegram.constants import ChatType, MessageLimit

from channels.base import ChannelBase, ChannelContext, SenderSpec, WebhookDoc
from channels.credentials import ChannelNotConfigured, CredentialField, Credentials
from channels.inbound import find_agent, read_json, validated
from channels.telegram_send import TelegramSender
from core.errors import Forbidden, InvalidInput, RateLimited
from core.inbound import FeedbackAnswer, InboundMessage, MediaItem, MediaKind
from core.settings import Settings
from core.store.agents import Agent
from core.store.inbox import Inbox
from core.turns import clean_payload
from core.wrong_secrets import WrongSecrets

log = logging.getLogger(__name__)

CHANNEL = "telegram"
SECRET_HEADER = "X-Telegram-Bot-Api-Secret-Token"  # noqa: S105 (a header name)
# What setWebhook's secret_token may hold (the Bot API allows 1-256 of these characters;
# fewer than 32 could be guessed), and what a secret stored before that rule may still be.
SECRET_ALPHABET = "A-Za-z0-9_-"  # noqa: S105 (a character class, not a secret)
MIN_SECRET_CHARS = 32
MAX_SECRET_CHARS = 256
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
    first_name: StrictStr | None = Field(None, max_length=256)
    last_name: StrictStr | None = Field(None, max_length=256)
    username: StrictStr | None = Field(None, max_length=64)


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


class TelegramCallbackQuery(_Shape):
    """A press of a button under one of the bot's messages. ``message`` is that message (its
    chat is where the press came from); ``data`` is what the button was sent with."""

    id: Annotated[StrictStr, Field(max_length=256)]
    sender: TelegramUser = Field(alias="from")
    message: TelegramMessage | None = None
    data: Annotated[StrictStr, Field(max_length=256)] | None = None


class TelegramUpdate(_Shape):
    """One Update; ``message`` is answered and a feedback button's ``callback_query`` is
    recorded, every other kind is acknowledged unread."""

    update_id: Annotated[StrictInt, Field(ge=0, le=2**63 - 1)]
    message: TelegramMessage | None = None
    callback_query: TelegramCallbackQuery | None = None


def _kind(data: dict[str, Any]) -> str:
    """The update's type as Telegram names it (``edited_message``, ``callback_query``, ...)."""
    return next((key for key in data if key != "update_id"), "empty")


def _classify(update: TelegramUpdate, data: dict[str, Any]) -> tuple[InboundMessage | None, str]:
    """(the message to store or None, its kind for the log)."""
    if update.callback_query is not None:
        return parse_press(update.update_id, update.callback_query), "callback_query"
    message = update.message
    if message is None:
        return None, _kind(data)
    if message.text:
        kind = "command" if message.text.startswith("/") else "text"
        return parse_message(update.update_id, message), kind
    media = next((name for name in _MEDIA if getattr(message, name)), None)
    if media is None:
        return None, "service"  # joins, leaves, pins, title changes, ...
    if message.chat.type != ChatType.PRIVATE:
        return None, f"group_{media}"
    return parse_message(update.update_id, message), media


# The attachment kinds, as `core.inbound` names them.
_KINDS: dict[str, MediaKind] = {
    "voice": "audio",
    "audio": "audio",
    "photo": "image",
    "video": "video",
    "video_note": "video",
    "animation": "video",
    "sticker": "sticker",
    "document": "document",
}


def _media(message: TelegramMessage) -> tuple[MediaItem, ...]:
    items = []
    for name in _MEDIA:
        value = getattr(message, name)
        if not value:
            continue
        if isinstance(value, list):  # photo: its sizes, smallest first
            value = value[-1] if isinstance(value[-1], dict) else {}
        file_id = value.get("file_id") if isinstance(value, dict) else None
        mime = value.get("mime_type") if isinstance(value, dict) else None
        items.append(
            MediaItem(
                _KINDS[name],
                str(file_id or ""),
                str(mime) if mime else ("image/jpeg" if name == "photo" else None),
            )
        )
    return tuple(items)


def parse_message(update_id: int, message: TelegramMessage) -> InboundMessage:
    """A Telegram message as every channel gives it."""
    text = (message.text or message.caption or "").strip()
    sender = message.sender
    name = None
    if sender is not None:
        name = " ".join(p for p in (sender.first_name, sender.last_name) if p).strip() or None
    return InboundMessage(
        customer_id=str(message.chat.id),
        provider_message_id=str(update_id),
        text=text,
        display_name=name,
        handle=sender.username if sender is not None else None,
        language_hint=sender.language_code if sender is not None else None,
        media=_media(message),
        command="start" if _is_start(message.text or "") else None,
        extra={"message_id": message.message_id},
    )


def parse_press(update_id: int, query: TelegramCallbackQuery) -> InboundMessage | None:
    """A press of a feedback button as every channel gives it; None for any other button,
    or one under a message Telegram no longer shows (its chat is not known then)."""
    answer = FeedbackAnswer.parse(query.data or "", receipt=query.id)
    if answer is None or query.message is None:
        return None
    sender = query.sender
    name = " ".join(p for p in (sender.first_name, sender.last_name) if p).strip() or None
    return InboundMessage(
        # The chat the bot's message is in, as Telegram says: the data names only a turn,
        # which is rated only if it belongs to this chat's conversation.
        customer_id=str(query.message.chat.id),
        provider_message_id=str(update_id),
        display_name=name,
        handle=sender.username,
        language_hint=sender.language_code,
        feedback=answer,
        extra={"message_id": query.message.message_id},
    )


def _is_start(text: str) -> bool:
    command = text.split(maxsplit=1)[0] if text.strip() else ""
    return command == "/start" or command.startswith("/start@")


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
    message, kind = _classify(update, data)
    if message is None:
        return Handled("ignored", update.update_id, kind)
    added = await inbox.add(agent.id, CHANNEL, message, data)
    return Handled("stored" if added else "duplicate", update.update_id, kind)


class TelegramBot(ChannelBase):
    """Telegram's Bot API."""

    name = CHANNEL
    title = "Telegram"
    block = "telegram"
    credential_fields = (
        CredentialField(
            "bot_token",
            "Bot token",
            "telegram_bot_token",
            secret=True,
            pattern=r"[0-9]{1,20}:[A-Za-z0-9_-]{20,100}",
            help="the token @BotFather gave, such as 123456789:AAH...",
        ),
        CredentialField(
            "webhook_secret",
            "Webhook secret",
            "telegram_webhook_secret",
            secret=True,
            required=True,
            pattern=f"[{SECRET_ALPHABET}]{{{MIN_SECRET_CHARS},{MAX_SECRET_CHARS}}}",
            help=f"{MIN_SECRET_CHARS}-{MAX_SECRET_CHARS} characters of A-Z, a-z, 0-9, _ and -",
            accepts=f"[{SECRET_ALPHABET}]{{1,{MAX_SECRET_CHARS}}}",
            renew="run `parley telegram set-webhook --agent {agent}` to replace it",
        ),
    )
    limit = TelegramSender.limit
    buttons = True  # the feedback prompt's 👍 / 👎 (an inline keyboard)
    writing_rule = (
        "You are writing a Telegram message: plain sentences and short paragraphs, "
        "no Markdown tables."
    )
    webhooks: Sequence[WebhookDoc] = (
        WebhookDoc(
            "post",
            "/webhooks/telegram/{agent}",
            "telegram_webhook",
            "Telegram Bot API webhook (JSON Update, X-Telegram-Bot-Api-Secret-Token)",
            "application/json",
        ),
    )

    def routes(self, context: ChannelContext) -> list[web.RouteDef]:
        return [web.post("/webhooks/telegram/{agent}", TelegramWebhook(self, context).webhook)]

    def bot_token(self, agent: Agent, settings: Settings) -> str | None:
        """The token replies are sent with: the agent's own bot, else the environment's."""
        if agent.settings.get(self.block) is None:
            token = settings.telegram_bot_token
            return token.get_secret_value() or None if token is not None else None
        return self.credentials(agent, settings).text("bot_token")

    async def check_credentials(self, agent: Agent | None, settings: Settings) -> str:
        """The bot the agent's token (None: the environment's) belongs to, by getMe
        (`parley doctor`); `ChannelNotConfigured` or `core.delivery.DeliveryError` when
        replies cannot be sent with it."""
        if agent is None:
            secret = settings.telegram_bot_token
            token = secret.get_secret_value() or None if secret is not None else None
        else:
            token = self.bot_token(agent, settings)
        if token is None:
            raise ChannelNotConfigured("no bot_token: replies cannot be sent")
        sender = TelegramSender(
            token,
            api_base=str(settings.telegram_api_base),
            timeout=settings.telegram_send_timeout_seconds,
        )
        try:
            return await sender.check()
        finally:
            await sender.close()

    def sender_spec(self, agent: Agent, settings: Settings) -> SenderSpec | None:
        try:
            token = self.bot_token(agent, settings)
        except ChannelNotConfigured:
            return None
        if token is None:
            return None
        return SenderSpec(
            (token,),
            lambda: TelegramSender(
                token,
                api_base=str(settings.telegram_api_base),
                timeout=settings.telegram_send_timeout_seconds,
            ),
        )

    async def fetch_media(
        self, http: aiohttp.ClientSession, agent: Agent, settings: Settings, ref: str
    ) -> tuple[bytes, str]:
        """An attachment by its ``file_id``: ``getFile``, then the file itself."""
        token = self.bot_token(agent, settings)
        if token is None:
            raise ChannelNotConfigured(f"no Telegram bot token for agent {agent.slug!r}")
        sender = TelegramSender(token, api_base=str(settings.telegram_api_base))
        try:
            return await sender.download(
                ref, max_bytes=settings.media_max_bytes, within=settings.media_timeout_seconds
            )
        finally:
            await sender.close()


class TelegramWebhook:
    def __init__(self, channel: TelegramBot, context: ChannelContext) -> None:
        self._channel = channel
        self._context = context
        self._settings = context.settings

    async def webhook(self, request: web.Request) -> web.Response:
        """``POST /webhooks/telegram/{agent}``: one Update from the Bot API."""
        agent = await find_agent(self._context.agents, request.match_info["agent"])
        await self._verify(agent, request)
        handled = await store_update(
            self._context.inbox, agent, _json_object(await read_json(request))
        )
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

    async def _verify(self, agent: Agent, request: web.Request) -> None:
        """403 unless the request is JSON with the agent's secret, checked before parsing;
        429 once the sender's address has sent too many wrong secrets."""
        try:
            secret = self._credentials(agent).secret("webhook_secret")
        except ChannelNotConfigured:
            log.warning("telegram.webhook.rejected agent=%s reason=not_configured", agent.slug)
            raise
        given = request.headers.get(SECRET_HEADER, "")
        reason = None
        if not hmac.compare_digest(
            given.encode(errors="replace"), secret.get_secret_value().encode() if secret else b""
        ):
            reason = "missing_secret" if not given else "wrong_secret"
            client = self._context.client(request)
            try:
                await WrongSecrets(self._context.cache, "telegram:webhook").failed(
                    client, "too many wrong webhook secrets from this address; try again later"
                )
            except RateLimited:
                log.warning("telegram.webhook.throttled agent=%s client=%s", agent.slug, client)
                raise
        elif request.content_type != "application/json":
            reason = "content_type"
        if reason is not None:
            log.warning("telegram.webhook.rejected agent=%s reason=%s", agent.slug, reason)
            raise Forbidden(f"not a webhook call from Telegram ({reason})")

    def _credentials(self, agent: Agent) -> Credentials:
        return self._channel.credentials(agent, self._settings)


def _json_object(data: Any) -> dict[str, Any]:
    if not isinstance(data, dict):
        raise InvalidInput("a Telegram Update is a JSON object")
    return data


TELEGRAM = TelegramBot()
