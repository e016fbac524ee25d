"""The agents table: one agent per website / knowledge base, with its persona and channels."""

from __future__ import annotations

import re
import secrets
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import asyncpg

from core.errors import AgentNotFound, Conflict, InvalidInput
from core.keyring import Keyring, SecretsKeyMissing, is_sealed
from core.store.vector_index import EmbedderIdentity, bind_embedder

_SLUG = re.compile(r"^[a-z0-9][a-z0-9-]{0,62}$")
_LANGUAGE = re.compile(r"^[a-z]{2,3}(-[a-z0-9]{2,8})?$")

# Per settings block of ``agents.settings``, the fields stored only sealed (core/keyring.py),
# such as {"twilio": ("auth_token",)}: the gateway's channel registry says which
# (`channels.registry.secret_fields`); core knows no channel. A block's other fields (an
# account id, the sending number) are not secret.
SecretFields = Mapping[str, Sequence[str]]


@dataclass(frozen=True, slots=True)
class Agent:
    id: int
    slug: str
    name: str
    default_language: str
    timezone: str
    persona: str
    custom_prompt: str
    confidence_threshold: float
    contact_route: str
    widget_key: str
    allowed_origins: tuple[str, ...]
    settings: Mapping[str, Any]
    embedder: str | None
    embedding_dim: int | None
    knowledge_version: int
    created_at: datetime

    @classmethod
    def from_row(cls, row: asyncpg.Record) -> Agent:
        values = dict(row)
        values["allowed_origins"] = tuple(values["allowed_origins"])
        return cls(**values)

    @property
    def site_url(self) -> str | None:
        """The agent's website, where pages stored with a root-relative URL live (ingested
        without a base URL): the site the widget runs on, its first https origin preferred."""
        secure = [origin for origin in self.allowed_origins if origin.startswith("https://")]
        return next(iter(secure or self.allowed_origins), None)


_COLUMNS = ", ".join(Agent.__dataclass_fields__)


def validate_slug(slug: str) -> str:
    if not _SLUG.match(slug):
        raise InvalidInput(
            f"agent name {slug!r} must be 1-63 lowercase letters, digits or hyphens, "
            "starting with a letter or digit (e.g. 'shop')"
        )
    return slug


def validate_language(language: str) -> str:
    language = language.strip().lower()
    if not _LANGUAGE.match(language):
        raise InvalidInput(f"language {language!r} must be a code such as 'en', 'nl' or 'de-ch'")
    return language


def validate_timezone(name: str) -> str:
    try:
        ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise InvalidInput(
            f"timezone {name!r} is not an IANA time zone such as 'Europe/Amsterdam'"
        ) from None
    return name


def seal_channel_secrets(
    settings: Mapping[str, Any], keyring: Keyring, secret_fields: SecretFields, *, owner: str = ""
) -> dict[str, Any]:
    """``settings`` with each channel secret (``secret_fields``) given in clear sealed under
    the current key; `SecretsKeyMissing` when there is one and no key to seal it with
    (``owner``, such as " of agent 'shop'", completes the name of the value in the message)."""
    sealed = dict(settings)
    for channel, names in secret_fields.items():
        block = settings.get(channel)
        if not isinstance(block, Mapping):
            continue
        clear = [name for name in names if isinstance(block.get(name), str) and block[name]]
        if clear:
            sealed[channel] = {
                **block,
                **{
                    name: keyring.seal(block[name], what=f"settings.{channel}.{name}{owner}")
                    for name in clear
                },
            }
    return sealed


@dataclass(frozen=True, slots=True)
class Resealed:
    """What `Agents.reseal_secrets` did."""

    key_id: str
    resealed: int  # values encrypted again under the current key (or for the first time)
    were_clear: int  # of those, values that had been stored in clear
    agents: int  # agents whose settings changed
    total: int  # channel secrets stored, all now under the current key


def new_widget_key() -> str:
    """A public key for the widget's script tag: identifies the agent, grants nothing else."""
    return "pk_" + secrets.token_urlsafe(18)


class Agents:
    """Reads and writes agents; every method takes its own connection from the pool.

    With ``fresh_for`` seconds, `get` answers from memory for that long: every turn looks
    its agent up, and settings changed elsewhere may take that long to apply.

    ``secret_fields`` (the registry's `channels.registry.secret_fields()`) names the channel
    secrets `update` seals with ``keyring``; one that writes settings without it seals none.
    """

    def __init__(
        self,
        pool: asyncpg.Pool,
        *,
        fresh_for: float = 0.0,
        keyring: Keyring | None = None,
        secret_fields: SecretFields | None = None,
    ) -> None:
        self._pool = pool
        self._fresh_for = fresh_for
        # Seals channel secrets written through `update`; without a key none can be written.
        self._keyring = keyring or Keyring()
        self._secret_fields: SecretFields = secret_fields or {}
        self._recent: dict[str, tuple[float, Agent]] = {}

    def unremembered(
        self, keyring: Keyring | None = None, secret_fields: SecretFields | None = None
    ) -> Agents:
        """The same agents read fresh every time (what staff see), sharing this one's memory,
        so that a change made through either is seen by both at once."""
        fresh = Agents(
            self._pool,
            keyring=keyring or self._keyring,
            secret_fields=secret_fields or self._secret_fields,
        )
        fresh._recent = self._recent
        return fresh

    async def create(
        self,
        slug: str,
        *,
        embedder: EmbedderIdentity,
        name: str | None = None,
        language: str = "en",
        timezone: str = "UTC",
    ) -> Agent:
        slug = validate_slug(slug)
        language = validate_language(language)
        timezone = validate_timezone(timezone)
        async with self._pool.acquire() as conn, conn.transaction():
            try:
                row = await conn.fetchrow(
                    f"""INSERT INTO agents (slug, name, default_language, timezone, widget_key)
                        VALUES ($1, $2, $3, $4, $5) RETURNING {_COLUMNS}""",
                    slug,
                    name or slug,
                    language,
                    timezone,
                    new_widget_key(),
                )
            except asyncpg.UniqueViolationError:
                raise Conflict(f"agent {slug!r} already exists") from None
            assert row is not None
            await bind_embedder(conn, row["id"], embedder)
        return await self.get(slug)

    async def update(self, slug: str, **changes: Any) -> Agent:
        """Change an agent's own settings (persona, threshold, origins, ...)."""
        allowed = {
            "name", "default_language", "timezone", "persona", "custom_prompt",
            "confidence_threshold", "contact_route", "allowed_origins", "settings",
        }  # fmt: skip
        unknown = set(changes) - allowed
        if unknown:
            raise InvalidInput(f"unknown agent setting(s): {', '.join(sorted(unknown))}")
        if "timezone" in changes:
            validate_timezone(changes["timezone"])
        if "default_language" in changes:
            changes["default_language"] = validate_language(changes["default_language"])
        if "allowed_origins" in changes:
            changes["allowed_origins"] = [o.rstrip("/") for o in changes["allowed_origins"]]
        if "settings" in changes:
            changes["settings"] = seal_channel_secrets(
                changes["settings"],
                self._keyring,
                self._secret_fields,
                owner=f" of agent {slug!r}",
            )
        self._recent.pop(slug, None)
        if changes:
            assignments = ", ".join(f"{name} = ${i}" for i, name in enumerate(changes, start=2))
            try:
                done = await self._pool.execute(
                    f"UPDATE agents SET {assignments}, updated_at = now() WHERE slug = $1",
                    slug,
                    *changes.values(),
                )
            except asyncpg.CheckViolationError as exc:
                raise InvalidInput(f"invalid agent setting: {exc.constraint_name}") from None
            if done == "UPDATE 0":
                raise AgentNotFound(slug)
        return await self.get(slug)

    async def reseal_secrets(self, keyring: Keyring, secret_fields: SecretFields) -> Resealed:
        """Seal every agent's channel secrets (``secret_fields``) under ``keyring``'s current
        key: those stored in clear and those sealed under an earlier key, in one transaction.
        A value no key of ``keyring`` opens stops it with `SecretUnreadable` before anything
        is written."""
        if keyring.current_id is None:
            raise SecretsKeyMissing("channel secrets")
        resealed = were_clear = agents = total = 0
        async with self._pool.acquire() as conn, conn.transaction():
            rows = await conn.fetch("SELECT slug, settings FROM agents ORDER BY slug FOR UPDATE")
            for row in rows:
                settings = dict(row["settings"])
                changed = False
                for channel, names in secret_fields.items():
                    block = settings.get(channel)
                    if not isinstance(block, Mapping):
                        continue
                    new_block = dict(block)
                    for name in names:
                        value = block.get(name)
                        if value is None or value == "":
                            continue
                        what = f"settings.{channel}.{name} of agent {row['slug']!r}"
                        if not isinstance(value, str) and not is_sealed(value):
                            raise InvalidInput(f"{what} is neither text nor a sealed value")
                        total += 1
                        sealed = keyring.reseal(value, what=what)
                        if sealed is not None:
                            new_block[name] = sealed
                            resealed += 1
                            were_clear += isinstance(value, str)
                            changed = True
                    settings[channel] = new_block
                if changed:
                    agents += 1
                    await conn.execute(
                        "UPDATE agents SET settings = $2 WHERE slug = $1", row["slug"], settings
                    )
        self._recent.clear()
        return Resealed(keyring.current_id, resealed, were_clear, agents, total)

    async def rotate_widget_key(self, slug: str) -> Agent:
        """A new widget key; pages embedding the old one stop working at once."""
        self._recent.pop(slug, None)
        done = await self._pool.execute(
            "UPDATE agents SET widget_key = $2, updated_at = now() WHERE slug = $1",
            slug,
            new_widget_key(),
        )
        if done == "UPDATE 0":
            raise AgentNotFound(slug)
        return await self.get(slug)

    async def get(self, slug: str) -> Agent:
        if self._fresh_for:
            remembered = self._recent.get(slug)
            if remembered is not None and remembered[0] > time.monotonic():
                return remembered[1]
        row = await self._pool.fetchrow(f"SELECT {_COLUMNS} FROM agents WHERE slug = $1", slug)
        if row is None:
            raise AgentNotFound(slug)
        agent = Agent.from_row(row)
        if self._fresh_for:
            self._recent[slug] = (time.monotonic() + self._fresh_for, agent)
        return agent

    async def by_id(self, agent_id: int) -> Agent:
        row = await self._pool.fetchrow(f"SELECT {_COLUMNS} FROM agents WHERE id = $1", agent_id)
        if row is None:
            raise AgentNotFound(str(agent_id))
        return Agent.from_row(row)

    async def list(self) -> list[Agent]:
        rows = await self._pool.fetch(f"SELECT {_COLUMNS} FROM agents ORDER BY slug")
        return [Agent.from_row(r) for r in rows]
