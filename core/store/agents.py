"""The agents table: one agent per website / knowledge base, with its persona and channels."""

from __future__ import annotations

import re
import secrets
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import asyncpg

from core.errors import AgentNotFound, Conflict, InvalidInput
from core.retrieval.embedders import EmbedderIdentity
from core.store.vector_index import bind_embedder

_SLUG = re.compile(r"^[a-z0-9][a-z0-9-]{0,62}$")
_LANGUAGE = re.compile(r"^[a-z]{2,3}(-[a-z0-9]{2,8})?$")


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


def new_widget_key() -> str:
    """A public key for the widget's script tag: identifies the agent, grants nothing else."""
    return "pk_" + secrets.token_urlsafe(18)


class Agents:
    """Reads and writes agents; every method takes its own connection from the pool.

    With ``fresh_for`` seconds, `get` answers from memory for that long: every turn looks
    its agent up, and settings changed elsewhere may take that long to apply.
    """

    def __init__(self, pool: asyncpg.Pool, *, fresh_for: float = 0.0) -> None:
        self._pool = pool
        self._fresh_for = fresh_for
        self._recent: dict[str, tuple[float, Agent]] = {}

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
