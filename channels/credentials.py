"""Where a messaging channel's secrets come from: the agent's own settings, else the environment.

An agent's ``settings["twilio"]`` / ``settings["telegram"]`` block is used as a whole when it
is present (an account's SID and another account's token never mix); without one, the
``TWILIO_*`` / ``TELEGRAM_*`` environment settings apply. Secrets are `SecretStr`, so they
never show in a repr, a log line or an error message.

This is the one place that opens an agent's stored secrets, which are sealed under
PARLEY_SECRETS_KEY (core/keyring.py). One stored in clear by an earlier version is still
used, with a warning (once per value and process) until `parley secrets rotate` seals it.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import SecretStr

from core.errors import Forbidden
from core.keyring import Keyring, SecretUnreadable, is_sealed
from core.settings import Settings
from core.store.agents import Agent

log = logging.getLogger(__name__)

# Telegram's own rule for setWebhook(secret_token=...).
_TELEGRAM_SECRET = re.compile(r"[A-Za-z0-9_-]{1,256}")


class ChannelNotConfigured(Forbidden):
    """A channel has no usable credentials for this agent: its webhooks are refused.

    A `Forbidden` (403) rather than a 500: without a secret nothing can be verified, and an
    unverified delivery must be refused, not stored.
    """

    code = "channel_not_configured"


class CredentialsUnreadable(ChannelNotConfigured):
    """The agent's stored secret cannot be opened: its key is not configured (or the stored
    value was altered). Refused like a missing credential; the log says which key is needed."""

    code = "channel_credentials_unreadable"


@dataclass(frozen=True, slots=True)
class TwilioCredentials:
    auth_token: SecretStr
    account_sid: str | None = None
    whatsapp_from: str | None = None
    source: str = "environment"  # or "agent": where they came from, for logs


@dataclass(frozen=True, slots=True)
class TelegramCredentials:
    webhook_secret: SecretStr
    bot_token: SecretStr | None = None
    source: str = "environment"


def _block(agent: Agent, channel: str) -> Mapping[str, Any] | None:
    block = agent.settings.get(channel)
    if block is None:
        return None
    if not isinstance(block, Mapping):
        raise ChannelNotConfigured(f"agent {agent.slug!r}: settings.{channel} must be an object")
    return block


def _text(agent: Agent, channel: str, block: Mapping[str, Any], name: str) -> str | None:
    value = block.get(name)
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise ChannelNotConfigured(f"agent {agent.slug!r}: settings.{channel}.{name} must be text")
    return value


# What was already logged about stored secrets, so that every webhook does not log it again.
_WARNED: set[tuple[int, str]] = set()


def _warn_once(agent: Agent, message: str) -> None:
    if (agent.id, message) not in _WARNED:
        _WARNED.add((agent.id, message))
        log.warning("%s", message)


def _secret(
    agent: Agent, channel: str, block: Mapping[str, Any], name: str, settings: Settings
) -> SecretStr | None:
    """A secret of the agent's block, opened with the configured keys."""
    value = block.get(name)
    field = f"settings.{channel}.{name}"
    if is_sealed(value):
        try:
            return Keyring.from_settings(settings).open(value, what=field)
        except SecretUnreadable as exc:
            _warn_once(agent, f"credentials.unreadable agent={agent.slug}: {exc.message}")
            raise CredentialsUnreadable(f"agent {agent.slug!r}: {exc.message}") from None
    text = _text(agent, channel, block, name)
    if text is None:
        return None
    _warn_once(
        agent,
        f"credentials.unencrypted agent={agent.slug} field={field}: stored in clear; "
        "set PARLEY_SECRETS_KEY and run `parley secrets rotate`",
    )
    return SecretStr(text)


def twilio_credentials(agent: Agent | None, settings: Settings) -> TwilioCredentials:
    """The agent's Twilio account, else the environment's; `ChannelNotConfigured` if neither."""
    block = _block(agent, "twilio") if agent is not None else None
    if agent is not None and block is not None:
        token = _secret(agent, "twilio", block, "auth_token", settings)
        if token is None:
            raise ChannelNotConfigured(
                f"agent {agent.slug!r}: settings.twilio has no auth_token; "
                "WhatsApp webhooks cannot be verified"
            )
        return TwilioCredentials(
            auth_token=token,
            account_sid=_text(agent, "twilio", block, "account_sid"),
            whatsapp_from=_text(agent, "twilio", block, "whatsapp_from"),
            source="agent",
        )
    if settings.twilio_auth_token is None or not settings.twilio_auth_token.get_secret_value():
        whose = f"agent {agent.slug!r}" if agent is not None else "this gateway"
        raise ChannelNotConfigured(
            f"WhatsApp is not configured for {whose}: set TWILIO_AUTH_TOKEN "
            "or the agent's settings.twilio"
        )
    return TwilioCredentials(
        auth_token=settings.twilio_auth_token,
        account_sid=settings.twilio_account_sid,
        whatsapp_from=settings.twilio_whatsapp_from,
    )


def telegram_bot_token(agent: Agent, settings: Settings) -> SecretStr | None:
    """The token replies are sent with: the agent's own bot, else the environment's."""
    block = _block(agent, "telegram")
    if block is not None:
        return _secret(agent, "telegram", block, "bot_token", settings)
    return settings.telegram_bot_token


def telegram_credentials(agent: Agent, settings: Settings) -> TelegramCredentials:
    """The agent's bot, else the environment's; `ChannelNotConfigured` without a webhook secret."""
    block = _block(agent, "telegram")
    if block is not None:
        secret = _secret(agent, "telegram", block, "webhook_secret", settings)
        if secret is None or not _TELEGRAM_SECRET.fullmatch(secret.get_secret_value()):
            raise ChannelNotConfigured(
                f"agent {agent.slug!r}: settings.telegram.webhook_secret must be 1-256 "
                "characters of A-Z, a-z, 0-9, _ and -; Telegram webhooks cannot be verified"
            )
        return TelegramCredentials(
            webhook_secret=secret,
            bot_token=_secret(agent, "telegram", block, "bot_token", settings),
            source="agent",
        )
    if settings.telegram_webhook_secret is None:
        raise ChannelNotConfigured(
            f"Telegram is not configured for agent {agent.slug!r}: set TELEGRAM_WEBHOOK_SECRET "
            "or the agent's settings.telegram"
        )
    return TelegramCredentials(
        webhook_secret=settings.telegram_webhook_secret, bot_token=settings.telegram_bot_token
    )
