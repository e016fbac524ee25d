"""`parley telegram set-webhook` (register the agent's webhook) and `poll` (local development).

An agent with a bot of its own but no webhook secret, or one weaker than Parley now needs
(stored by an earlier version), is given a new one by ``set-webhook``: random, stored
encrypted in its settings and registered with Telegram, never printed.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import logging
import re
import secrets
import signal
import sys
import warnings
from typing import Any
from urllib.parse import urlsplit

from telegram import Bot
from telegram.error import Conflict as TelegramConflict
from telegram.error import InvalidToken, NetworkError, RetryAfter, TelegramError
from telegram.warnings import PTBDeprecationWarning, PTBUserWarning

from channels.credentials import ChannelNotConfigured, CredentialsUnreadable, own_credentials
from channels.telegram import (
    MAX_SECRET_CHARS,
    MIN_SECRET_CHARS,
    SECRET_ALPHABET,
    TELEGRAM,
    store_update,
)
from channels.telegram_send import TelegramSender
from core.delivery import DeliveryError
from core.errors import ConfigError, Conflict, InvalidInput, ParleyError, Unavailable
from core.keyring import Keyring
from core.logcontext import configure_logging
from core.settings import Settings
from core.store import Agents
from core.store.agents import Agent
from core.store.inbox import Inbox
from gateway.runtime import Runtime

log = logging.getLogger(__name__)

ALLOWED_UPDATES = ["message", "callback_query"]  # messages, and presses of feedback buttons
MAX_CONNECTIONS = 40
POLL_TIMEOUT = 25  # seconds a getUpdates call waits for news
_WEBHOOK_PORTS = (443, 80, 88, 8443)  # the only ports Telegram calls
_BACKOFF_MAX = 30.0
_STRONG = re.compile(f"[{SECRET_ALPHABET}]{{{MIN_SECRET_CHARS},{MAX_SECRET_CHARS}}}")


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    telegram = commands.add_parser("telegram", help="connect an agent's Telegram bot")
    actions = telegram.add_subparsers(dest="action", metavar="ACTION", required=True)
    hook = actions.add_parser(
        "set-webhook", help="register the agent's webhook URL and secret with the bot"
    )
    hook.add_argument("--agent", required=True, metavar="A")
    hook.add_argument(
        "--url",
        help="the https URL Telegram should call "
        "(default: PARLEY_PUBLIC_URL + /webhooks/telegram/A)",
    )
    poll = actions.add_parser(
        "poll",
        help="local development without a public URL: delete the webhook and fetch updates "
        "into the inbox until stopped",
    )
    poll.add_argument("--agent", required=True, metavar="A")
    poll.add_argument(
        "--timeout",
        type=int,
        default=POLL_TIMEOUT,
        help=f"seconds each getUpdates call waits (default {POLL_TIMEOUT})",
    )


async def run(args: argparse.Namespace, runtime: Runtime) -> int:
    agent = await Agents(runtime.database.pool).get(args.agent)
    if args.action == "set-webhook":
        return await set_webhook(agent, runtime.settings, args.url, runtime.agents)
    configure_logging(runtime.settings.log_level)  # runs until stopped, so it logs as a worker
    return await poll(agent, runtime, wait=args.timeout)


def _webhook_url(agent: Agent, settings: Settings, given: str | None) -> str:
    if given is None:
        if settings.public_url is None:
            raise ConfigError(
                "PARLEY_PUBLIC_URL is not set: set it to the gateway's public https address, "
                "pass --url, or use `parley telegram poll` without one"
            )
        given = f"{settings.public_url}/webhooks/telegram/{agent.slug}"
    parts = urlsplit(given)
    if parts.scheme != "https" or not parts.hostname:
        raise ConfigError(f"Telegram only calls https webhook URLs, not {given!r}")
    try:
        port = parts.port
    except ValueError:
        raise ConfigError(f"webhook URL {given!r} has an invalid port") from None
    if port not in (None, *_WEBHOOK_PORTS):
        raise ConfigError(f"Telegram only calls webhooks on ports 443, 80, 88 and 8443, not {port}")
    return given


def _bot_token(agent: Agent, settings: Settings, *, need_secret: bool) -> str:
    """The agent's bot token, else TELEGRAM_BOT_TOKEN. Polling needs no webhook secret, so
    without an agent block the environment's token is enough for it."""
    try:
        token = TELEGRAM.credentials(agent, settings).secret("bot_token")
    except ChannelNotConfigured:
        if need_secret or agent.settings.get("telegram") is not None:
            raise
        token = settings.telegram_bot_token
    if token is None or not token.get_secret_value():
        where = (
            f"agent {agent.slug!r}: settings.telegram has no bot_token"
            if agent.settings.get("telegram") is not None
            else f"no Telegram bot token for agent {agent.slug!r}: set TELEGRAM_BOT_TOKEN "
            "or the agent's settings.telegram.bot_token"
        )
        raise ConfigError(where)
    return token.get_secret_value()


def _refused(exc: TelegramError | DeliveryError, token: str, api_base: str) -> ParleyError:
    """Our one-line error for the Bot API's; PTB's messages may quote the token."""
    text = str(exc).replace(token, "<token>")
    code = getattr(exc, "code", None)
    if isinstance(exc, InvalidToken) or code == "invalid_token":
        return ConfigError(f"Telegram refused the bot token ({text})")
    if isinstance(exc, TelegramConflict):
        return Conflict(f"Telegram: {text}")
    if isinstance(exc, NetworkError) or code in ("network", "timeout"):
        return Unavailable(f"cannot reach the Telegram Bot API at {api_base}: {text}")
    return InvalidInput(f"Telegram refused the request: {text}")


async def _open_bot(sender: TelegramSender, token: str, api_base: str) -> Bot:
    try:
        return await sender.start()  # getMe; hides the token in PTB's and httpx's logs
    except DeliveryError as exc:
        raise _refused(exc, token, api_base) from None


async def _with_strong_secret(agent: Agent, settings: Settings, agents: Agents) -> Agent:
    """The agent, given a new webhook secret when its own Telegram block has none or a weak
    one. The environment's is checked when the settings are read (`core.settings`)."""
    block = agent.settings.get("telegram")
    if not isinstance(block, dict) or not own_credentials(block):
        return agent
    if block.get("webhook_secret"):
        try:
            stored = TELEGRAM.credentials(agent, settings).secret("webhook_secret")
        except CredentialsUnreadable:
            raise  # the key it was sealed with is needed here: nothing is replaced without it
        except ChannelNotConfigured:
            stored = None  # of a form no Telegram secret has: replaced like a missing one
        if stored is not None and _STRONG.fullmatch(stored.get_secret_value()):
            return agent
    # 32 random bytes in URL-safe base64: 43 characters, all of Telegram's alphabet.
    made = secrets.token_urlsafe(32)
    sealing = agents.unremembered(Keyring.from_settings(settings))
    updated = await sealing.update(
        agent.slug, settings={**agent.settings, "telegram": {**block, "webhook_secret": made}}
    )
    log.info("telegram.webhook.secret_made agent=%s", agent.slug)
    print(f"stored a new webhook secret for {agent.slug} (encrypted; it is not shown)")
    return updated


async def set_webhook(agent: Agent, settings: Settings, url: str | None, agents: Agents) -> int:
    url = _webhook_url(agent, settings, url)
    agent = await _with_strong_secret(agent, settings, agents)
    secret = TELEGRAM.credentials(agent, settings).secret("webhook_secret")
    if secret is None:  # a required field: `credentials` refuses a block without it
        raise ChannelNotConfigured(f"no Telegram webhook secret for agent {agent.slug!r}")
    token = _bot_token(agent, settings, need_secret=True)
    api_base = str(settings.telegram_api_base)
    sender = TelegramSender(token, api_base=api_base)
    try:
        bot = await _open_bot(sender, token, api_base)
        try:
            await bot.set_webhook(
                url,
                secret_token=secret.get_secret_value(),
                allowed_updates=ALLOWED_UPDATES,
                drop_pending_updates=False,
                max_connections=MAX_CONNECTIONS,
            )
            info = await bot.get_webhook_info()
        except TelegramError as exc:
            raise _refused(exc, token, api_base) from None
    finally:
        await sender.close()
    log.info("telegram.webhook.set agent=%s", agent.slug)
    print(f"webhook of @{bot.username} for {agent.slug}: {info.url}")
    print(f"{info.pending_update_count} pending updates")
    if info.last_error_message:
        print(f"last delivery error: {info.last_error_message}", file=sys.stderr)
    return 0


async def poll(agent: Agent, runtime: Runtime, *, wait: int = POLL_TIMEOUT) -> int:
    """Delete the webhook, then store updates as the webhook would until SIGINT/SIGTERM."""
    settings = runtime.settings
    token = _bot_token(agent, settings, need_secret=False)
    api_base = str(settings.telegram_api_base)
    sender = TelegramSender(token, api_base=api_base)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        bot = await _open_bot(sender, token, api_base)
        poller = _Poller(bot, Inbox(runtime.database.pool), agent, wait)
        try:
            await poller.delete_webhook()
            log.info("telegram.poll.started agent=%s bot=@%s", agent.slug, bot.username)
            polling = asyncio.create_task(poller.run())
            stopping = asyncio.create_task(stop.wait())
            await asyncio.wait([polling, stopping], return_when=asyncio.FIRST_COMPLETED)
            for task in (polling, stopping):
                task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await polling  # raises what stopped it, unless it was us
            await poller.confirm()
        except TelegramError as exc:
            raise _refused(exc, token, api_base) from None
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
        await sender.close()
    log.info("telegram.poll.stopped agent=%s", agent.slug)
    return 0


class _Poller:
    """getUpdates in a loop; an update is stored before the offset moves past it, so a crash
    at worst reads it again, and the inbox's key on ``update_id`` makes that a no-op."""

    def __init__(self, bot: Bot, inbox: Inbox, agent: Agent, wait: int) -> None:
        self._bot = bot
        self._inbox = inbox
        self._agent = agent
        self._wait = wait  # seconds each getUpdates call may wait for news
        self._offset: int | None = None  # the next update_id to ask for
        self._confirmed: int | None = None  # the offset Telegram has last been given

    async def delete_webhook(self) -> None:
        # Telegram refuses getUpdates while a webhook is set; say so, since a deployed
        # gateway stops receiving messages until set-webhook is run again.
        info = await self._bot.get_webhook_info()
        await self._bot.delete_webhook(drop_pending_updates=False)
        if info.url:
            log.warning("telegram.poll.webhook_deleted agent=%s", self._agent.slug)
            print(
                f"deleted the webhook {info.url}; run `parley telegram set-webhook --agent "
                f"{self._agent.slug}` to restore it",
                file=sys.stderr,
            )

    async def run(self) -> None:
        delay = 0.0
        while True:
            try:
                updates = await self._get_updates(self._wait)
            except RetryAfter as exc:
                delay = _retry_after(exc)
            except NetworkError as exc:  # TimedOut included; Conflict and InvalidToken are not
                delay = min(max(delay * 2, 1.0), _BACKOFF_MAX)
                log.warning("telegram.poll.retry delay=%.0f error=%s", delay, type(exc).__name__)
            else:
                delay = 0.0
                for data in updates:
                    await self._handle(data)
                continue
            await asyncio.sleep(delay)

    async def confirm(self) -> None:
        """Tell Telegram which updates are stored, so the next run does not read them again."""
        if self._offset is None or self._offset == self._confirmed:
            return
        try:
            async with asyncio.timeout(5):
                await self._get_updates(0, limit=1)
        except (TelegramError, TimeoutError) as exc:
            # Harmless: the next run reads them again and the inbox ignores them.
            log.warning("telegram.poll.confirm_failed error=%s", type(exc).__name__)

    async def _get_updates(self, wait: int, limit: int = 100) -> list[dict[str, Any]]:
        params: dict[str, Any] = {
            "timeout": wait,
            "limit": limit,
            "allowed_updates": ALLOWED_UPDATES,
        }
        if self._offset is not None:
            params["offset"] = self._offset
        # Through do_api_request for the raw JSON: the inbox stores an update as Telegram
        # sent it, like the webhook does, not as PTB would serialise it again. PTB warns
        # that get_updates exists.
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", "Please use 'Bot.getUpdates'", PTBUserWarning)
            result = await self._bot.do_api_request(
                "getUpdates", api_kwargs=params, read_timeout=wait + 10
            )
        self._confirmed = self._offset
        return list(result) if isinstance(result, list) else []

    async def _handle(self, data: dict[str, Any]) -> None:
        update_id = data.get("update_id")
        if not isinstance(update_id, int):
            log.warning("telegram.poll.ignored agent=%s kind=no_update_id", self._agent.slug)
            return
        try:
            handled = await store_update(self._inbox, self._agent, data)
        except InvalidInput:
            log.warning(
                "telegram.poll.ignored agent=%s update_id=%d kind=invalid",
                self._agent.slug,
                update_id,
            )
        else:
            log.info(
                "telegram.poll.%s agent=%s update_id=%d kind=%s",
                handled.outcome,
                self._agent.slug,
                handled.update_id,
                handled.kind,
            )
        self._offset = update_id + 1


def _retry_after(exc: RetryAfter) -> float:
    # Reading the attribute warns in PTB 22 unless PTB_TIMEDELTA is set; both forms work.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PTBDeprecationWarning)
        value = exc.retry_after
    return value.total_seconds() if isinstance(value, dt.timedelta) else float(value)
