"""Where a messaging channel's secrets come from: the agent's own settings, else the environment.

Each channel declares its fields (`CredentialField`); an agent's ``settings[block]`` (for
example ``settings["twilio"]``) is used as a whole when it is present (an account's SID and
another account's token never mix); without one, or with one that holds only the channel's
options (`OPTION_KEYS`: its templates), the environment's settings apply. Secrets
are `SecretStr`, so they never show in a repr, a log line or an error message.

This is the one place that opens an agent's stored secrets, which are sealed under
PARLEY_SECRETS_KEY (core/keyring.py). One stored in clear by an earlier version is still
used, with a warning (once per value and process) until `parley secrets rotate` seals it.
"""

from __future__ import annotations

import hashlib
import logging
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import SecretStr

from core.errors import Forbidden
from core.keyring import Keyring, SecretUnreadable, is_sealed
from core.settings import Settings
from core.store.agents import Agent

log = logging.getLogger(__name__)


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
class CredentialField:
    """One field of a channel's credentials, in the agent's ``settings[block]`` (per agent)
    and in `Settings` (``setting``: the environment's default for every agent).

    ``secret`` fields are stored sealed and never shown back; ``required`` ones must be set
    for the channel's webhooks to be verified at all; ``pattern`` is what a value must match.
    ``accepts``, when the rule was made stricter, is what a value stored under the old rule
    may be: still used, so that an upgrade cuts no channel off, with a warning (once per
    value) that ends with ``renew`` (``{agent}`` is the agent's slug).
    """

    name: str
    label: str
    setting: str | None = None
    secret: bool = False
    required: bool = False
    pattern: str | None = None
    help: str = ""
    accepts: str | None = None
    renew: str = "set a new one"


@dataclass(frozen=True, slots=True)
class Credentials:
    """A channel's credentials for one agent: every declared field, secrets as `SecretStr`."""

    values: Mapping[str, str | SecretStr | None]
    source: str = "environment"  # or "agent": where they came from, for logs

    def text(self, name: str) -> str | None:
        value = self.values.get(name)
        if isinstance(value, SecretStr):
            return value.get_secret_value() or None
        return value or None

    def secret(self, name: str) -> SecretStr | None:
        value = self.values.get(name)
        if value is None or value == "":
            return None
        return value if isinstance(value, SecretStr) else SecretStr(value)


# Keys of a channel's settings block that are the channel's options, not its credentials:
# an agent may list its approved templates and still send with the environment's account.
OPTION_KEYS = frozenset({"templates"})


def own_credentials(block: Mapping[str, Any] | None) -> bool:
    """Whether a channel's settings block holds credentials of the agent's own: any block
    but one that holds nothing but options (its templates)."""
    if block is None:
        return False
    return not block or not set(block) <= OPTION_KEYS


def _block(agent: Agent, block_name: str) -> Mapping[str, Any] | None:
    """The agent's own credentials block, or None (none, or options only)."""
    block = agent.settings.get(block_name)
    if block is None:
        return None
    if not isinstance(block, Mapping):
        raise ChannelNotConfigured(f"agent {agent.slug!r}: settings.{block_name} must be an object")
    return block if own_credentials(block) else None


def _text(agent: Agent, channel: str, block: Mapping[str, Any], name: str) -> str | None:
    value = block.get(name)
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise ChannelNotConfigured(f"agent {agent.slug!r}: settings.{channel}.{name} must be text")
    return value


# What was already logged about stored secrets, so that every webhook does not log it again.
_WARNED: set[tuple[int, str, str, str]] = set()


def _warn_once(agent: Agent, message: str, value: object) -> None:
    """Log ``message`` once per agent and stored value (a digest of it, never the value)."""
    digest = hashlib.sha256(repr(value).encode()).hexdigest()
    key = (agent.id, agent.created_at.isoformat(), message, digest)
    if key not in _WARNED:
        _WARNED.add(key)
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
            _warn_once(agent, f"credentials.unreadable agent={agent.slug}: {exc.message}", value)
            raise CredentialsUnreadable(f"agent {agent.slug!r}: {exc.message}") from None
    text = _text(agent, channel, block, name)
    if text is None:
        return None
    _warn_once(
        agent,
        f"credentials.unencrypted agent={agent.slug} field={field}: stored in clear; "
        "set PARLEY_SECRETS_KEY and run `parley secrets rotate`",
        value,
    )
    return SecretStr(text)


def _checked(
    title: str,
    where: str,
    spec: CredentialField,
    value: str | SecretStr | None,
    agent: Agent | None = None,
    block_name: str = "",
) -> None:
    """A required field (what verifies the webhooks) of the wrong form verifies nothing; the
    others are checked when staff set them (the admin API). An agent's value that only the
    older rule (``accepts``) allows is used, and warned about."""
    if value is None or not spec.required:
        return
    plain = value.get_secret_value() if isinstance(value, SecretStr) else value
    if spec.pattern is not None and not re.fullmatch(spec.pattern, plain):
        if agent is not None and spec.accepts is not None and re.fullmatch(spec.accepts, plain):
            _warn_once(
                agent,
                f"credentials.weak agent={agent.slug} field=settings.{block_name}.{spec.name}: "
                f"stored before Parley needed {spec.help or spec.pattern}; "
                f"{spec.renew.format(agent=agent.slug)}",
                value,
            )
            return
        raise ChannelNotConfigured(
            f"{where}: {spec.name} does not have the form {title} needs "
            f"({spec.help or spec.pattern})"
        )


def resolve_credentials(
    title: str,
    block_name: str,
    fields: Sequence[CredentialField],
    agent: Agent | None,
    settings: Settings,
) -> Credentials:
    """The agent's ``settings[block_name]`` as a whole when it has one (an account's id and
    another account's token never mix), else the environment's settings;
    `ChannelNotConfigured` when a required field is missing (nothing can be verified)."""
    block = _block(agent, block_name) if agent is not None else None
    values: dict[str, str | SecretStr | None] = {}
    if agent is not None and block is not None:
        for spec in fields:
            value: str | SecretStr | None = (
                _secret(agent, block_name, block, spec.name, settings)
                if spec.secret
                else _text(agent, block_name, block, spec.name)
            )
            where = f"agent {agent.slug!r}: settings.{block_name}"
            if spec.required and value is None:
                raise ChannelNotConfigured(
                    f"{where} has no {spec.name}; {title} webhooks cannot be verified"
                )
            _checked(title, where, spec, value, agent, block_name)
            values[spec.name] = value
        return Credentials(values, source="agent")
    for spec in fields:
        raw = getattr(settings, spec.setting) if spec.setting else None
        if isinstance(raw, SecretStr) and not raw.get_secret_value():
            raw = None
        values[spec.name] = raw if raw is None or isinstance(raw, SecretStr) else str(raw)
        if spec.required and values[spec.name] is None:
            whose = f"agent {agent.slug!r}" if agent is not None else "this gateway"
            env = spec.setting.upper() if spec.setting else spec.name
            raise ChannelNotConfigured(
                f"{title} is not configured for {whose}: set {env} "
                f"or the agent's settings.{block_name}"
            )
        _checked(title, "the environment", spec, values[spec.name])
    return Credentials(values)
