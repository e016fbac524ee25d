"""Sends Telegram replies with python-telegram-bot's `Bot`, split at 4096 characters a part."""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import mimetypes
import warnings
from collections.abc import Awaitable, Sequence
from typing import TypeVar

import httpx
from telegram import Bot, InlineKeyboardButton, InlineKeyboardMarkup
from telegram.constants import ChatAction, ParseMode
from telegram.error import (
    BadRequest,
    ChatMigrated,
    Forbidden,
    InvalidToken,
    NetworkError,
    RetryAfter,
    TelegramError,
    TimedOut,
)
from telegram.request import HTTPXRequest
from telegram.warnings import PTBDeprecationWarning

from channels.citations import telegram_html
from channels.delivery import keep_typing
from core.delivery import Choice, DeliveryError, Sent, too_long
from core.errors import MediaUnavailable

log = logging.getLogger(__name__)
T = TypeVar("T")

TELEGRAM_API = "https://api.telegram.org"
MAX_TEXT_CHARS = 4096  # counted after entity parsing, so on the unescaped text
TYPING_INTERVAL = 4.0  # a typing action shows for at most 5 s
# The Bot API server answers sendMessage once Telegram has the message. Before that it waits
# out flood-control and back-off delays itself, up to 8 s in all for a bot (TDLib's
# NetQueryCreator: total_timeout_limit = 8 when the client is a bot; 60 s for users), and only
# then answers 429. A client that gives up sooner, as python-telegram-bot's default 5 s read
# timeout does, sees a timeout for a message that is then delivered, and a retry repeats it.
SERVER_WAIT = 8.0
# How long a send may take: well above SERVER_WAIT plus the round trips. The Bot API has no
# look-up of sent messages, so a send that outlasts this is sent again (README: "What can be
# lost or repeated"). Keep it below the outbox lease (60 s).
SEND_TIMEOUT = 30.0
CONNECT_TIMEOUT = 10.0
# A typing action is a courtesy that is repeated anyway: it never waits that long.
TYPING_TIMEOUT = 5.0
# Loggers whose records carry Bot API URLs, which contain the token.
_LOGGERS_WITH_URLS = ("telegram.Bot", "httpx")
# Errors no retry can fix, and the code each is reported with.
_PERMANENT: dict[type[TelegramError], str] = {
    Forbidden: "forbidden",  # blocked by the user, kicked from the group
    InvalidToken: "invalid_token",
    ChatMigrated: "chat_migrated",  # a group became a supergroup with a new id
    BadRequest: "bad_request",  # chat not found, message empty, ...
}


class _RedactToken(logging.Filter):
    """Hides the bot token, which is part of every Bot API URL, in httpx's request log."""

    def __init__(self, token: str) -> None:
        super().__init__()
        self._token = token

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if self._token in message:
            record.msg = message.replace(self._token, "<token>")
            record.args = None
        return True


class TelegramSender:
    """Sends text to Telegram chats as one bot; `start` checks the token (getMe).

    The token is in every Bot API URL, and PTB and httpx log those URLs; while a sender is
    open a filter on their loggers replaces it with ``<token>``.
    """

    limit = MAX_TEXT_CHARS

    def __init__(
        self,
        token: str,
        *,
        api_base: str = TELEGRAM_API,
        timeout: float = SEND_TIMEOUT,
        typing_interval: float = TYPING_INTERVAL,
    ) -> None:
        self._token = token
        self._api_base = api_base.rstrip("/")
        self._timeout = timeout
        self._typing_interval = typing_interval
        self._redact = _RedactToken(token)
        self._bot: Bot | None = None

    def __repr__(self) -> str:
        return f"TelegramSender(api_base={self._api_base!r})"

    async def start(self) -> Bot:
        """Open the HTTP client and check the token (getMe); `send` does it when needed."""
        if self._bot is None:
            # Before the Bot exists: it logs its URL, token included, when it is built.
            for name in _LOGGERS_WITH_URLS:
                logging.getLogger(name).addFilter(self._redact)
            # PTB's own read timeout (5 s) would end a send long before ours; ours governs.
            request = HTTPXRequest(
                connect_timeout=min(CONNECT_TIMEOUT, self._timeout),
                read_timeout=self._timeout,
                write_timeout=self._timeout,
            )
            self._bot = Bot(
                self._token,
                base_url=self._api_base + "/bot",
                base_file_url=self._api_base + "/file/bot",
                request=request,
            )
        try:
            await self._bot.initialize()
        except TelegramError as exc:
            raise self._classify(exc) from None
        return self._bot

    async def close(self) -> None:
        bot, self._bot = self._bot, None
        try:
            if bot is not None:
                await bot.shutdown()
        finally:
            for name in _LOGGERS_WITH_URLS:
                logging.getLogger(name).removeFilter(self._redact)

    async def send(self, recipient: str | int, text: str) -> Sent:
        """Send one part (≤ 4096 characters) to chat ``recipient``."""
        if len(text) > self.limit:
            raise too_long(text, self.limit)
        bot = await self.start()
        return await self._send_part(bot, recipient, text)

    async def check(self) -> str:
        """Which bot the token belongs to (getMe): `parley doctor` asks. A refused token or
        a Bot API that does not answer is a `DeliveryError`."""
        bot = await self.start()
        me = await self._checked(bot.get_me())
        return f"bot @{me.username}"

    async def send_choices(
        self, recipient: str | int, text: str, choices: Sequence[Choice]
    ) -> Sent:
        """Send one part with ``choices`` as inline buttons under it, side by side."""
        if len(text) > self.limit:
            raise too_long(text, self.limit)
        keyboard = InlineKeyboardMarkup(
            [[InlineKeyboardButton(c.label, callback_data=c.data) for c in choices]]
        )
        bot = await self.start()
        return await self._send_part(bot, recipient, text, keyboard)

    async def acknowledge(self, receipt: str) -> None:
        """Answer a button press (``answerCallbackQuery``), so the customer's app stops
        showing it as pending. A courtesy: failures are logged, never raised."""
        try:
            bot = await self.start()
            await self._checked(bot.answer_callback_query(receipt), within=TYPING_TIMEOUT)
        except DeliveryError as exc:
            log.warning("telegram.acknowledge.failed code=%s", exc.code)

    async def download(self, file_id: str, *, max_bytes: int, within: float) -> tuple[bytes, str]:
        """A file a customer sent (``getFile``, then the file), with its content type; a
        `core.media.MediaUnavailable` when it is larger than ``max_bytes`` or too slow."""
        bot = await self.start()
        try:
            async with asyncio.timeout(within):
                found = await bot.get_file(file_id)
                if found.file_size is not None and found.file_size > max_bytes:
                    raise MediaUnavailable("too_large", transient=False)
                data = bytes(await found.download_as_bytearray())
        except TimeoutError:
            raise MediaUnavailable("timeout", transient=True) from None
        except TelegramError as exc:
            error = self._classify(exc)
            raise MediaUnavailable(
                f"telegram_{error.code}", transient=not error.permanent
            ) from None
        if len(data) > max_bytes:
            raise MediaUnavailable("too_large", transient=False)
        kind = mimetypes.guess_type(found.file_path or "")[0] or "application/octet-stream"
        return data, kind

    async def typing(self, chat_id: str | int) -> None:
        """Show "typing..." in the chat for up to 5 seconds."""
        bot = await self.start()
        limit = min(TYPING_TIMEOUT, self._timeout)
        action = bot.send_chat_action(chat_id, ChatAction.TYPING, read_timeout=limit)
        await self._checked(action, within=limit)

    async def keep_typing(self, chat_id: str, message_id: str | None, until: asyncio.Event) -> None:
        """Show "typing..." until ``until`` is set (while an answer is being generated)."""
        await keep_typing(lambda: self.typing(chat_id), until, interval=self._typing_interval)

    async def _send_part(
        self,
        bot: Bot,
        chat_id: str | int,
        text: str,
        keyboard: InlineKeyboardMarkup | None = None,
    ) -> Sent:
        try:
            message = await self._timed(
                bot.send_message(
                    chat_id, telegram_html(text), parse_mode=ParseMode.HTML, reply_markup=keyboard
                )
            )
        except BadRequest as exc:
            if "can't parse entities" not in exc.message.lower():
                raise self._classify(exc) from None
            # Escaped text should always parse; if Telegram still refuses it, plain text
            # loses only the formatting (sources keep their URLs), never the answer.
            log.info("telegram.send.plain_fallback")
            message = await self._checked(bot.send_message(chat_id, text, reply_markup=keyboard))
        except (TelegramError, TimeoutError) as exc:
            raise self._classify(exc) from None
        return Sent(str(message.message_id))

    async def _timed(self, call: Awaitable[T], within: float | None = None) -> T:
        async with asyncio.timeout(self._timeout if within is None else within):
            return await call

    async def _checked(self, call: Awaitable[T], within: float | None = None) -> T:
        try:
            return await self._timed(call, within)
        except (TelegramError, TimeoutError) as exc:
            raise self._classify(exc) from None

    def _classify(self, exc: Exception) -> DeliveryError:
        """Our error for PTB's; ``from None`` at the raise sites because PTB's own messages
        may quote the token (InvalidToken does)."""
        text = str(exc).replace(self._token, "<token>") or type(exc).__name__
        if isinstance(exc, RetryAfter):
            return DeliveryError(text, code="rate_limited", retry_after=_retry_after(exc))
        if isinstance(exc, TimedOut | TimeoutError):
            return DeliveryError(text, code="timeout", ambiguous=_may_have_arrived(exc))
        for kind, code in _PERMANENT.items():
            if isinstance(exc, kind):
                return DeliveryError(text, code=code, permanent=True)
        if isinstance(exc, NetworkError):
            return DeliveryError(text, code="network", ambiguous=_may_have_arrived(exc))
        return DeliveryError(text, code="telegram_error")


def _may_have_arrived(exc: Exception) -> bool:
    """Whether Telegram may have the message although no answer came: anything but a
    connection that was never made (or never taken from the pool). A 5xx answer from
    Telegram's front end counts too: the Bot API server behind it may still have sent it."""
    # PTB raises its errors from httpx's, the transport it is built on.
    never_sent = httpx.ConnectError | httpx.ConnectTimeout | httpx.PoolTimeout
    return not isinstance(exc.__cause__, never_sent)


def _retry_after(exc: RetryAfter) -> float:
    # Reading the attribute warns in PTB 22 unless PTB_TIMEDELTA is set; both forms work.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PTBDeprecationWarning)
        value = exc.retry_after
    return value.total_seconds() if isinstance(value, dt.timedelta) else float(value)
