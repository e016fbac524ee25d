"""API keys for the JSON API: shown once, stored as a SHA-256 hash, looked up by hash."""

from __future__ import annotations

import hashlib
import secrets

import asyncpg

from core.errors import Unauthorized


def _hash(key: str) -> bytes:
    return hashlib.sha256(key.encode()).digest()


class ApiKeys:
    def __init__(self, pool: asyncpg.Pool) -> None:
        self._pool = pool

    async def create(self, agent_id: int, name: str = "") -> str:
        """A new key for the agent; the only time the key itself is ever available."""
        key = "sk_" + secrets.token_urlsafe(32)
        await self._pool.execute(
            "INSERT INTO api_keys (agent_id, name, prefix, key_hash) VALUES ($1, $2, $3, $4)",
            agent_id,
            name,
            key[:10],
            _hash(key),
        )
        return key

    async def agent_for(self, key: str) -> int:
        """The agent a valid, unrevoked key belongs to; `Unauthorized` otherwise."""
        agent_id: int | None = await self._pool.fetchval(
            """UPDATE api_keys SET last_used_at = now()
                WHERE key_hash = $1 AND revoked_at IS NULL RETURNING agent_id""",
            _hash(key),
        )
        if agent_id is None:
            raise Unauthorized("invalid API key")
        return agent_id
