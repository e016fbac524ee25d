"""Staff's work on conversations: read marks, open/pending/resolved, assignment, labels,
internal notes and saved replies.

Notes live in their own table, never in ``messages``: the bot's memory, the prompt and the
outbox read only messages, so a note cannot reach the customer. Each change is announced on
the conversations feed (kind ``inbox``) so live conversation lists refresh.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import asyncpg

from core.errors import Conflict, InvalidInput, NotFound
from core.store.handoff import FEED_CHANNEL
from core.store.transcripts import INBOX_STATUSES

MAX_LABEL = 50
MAX_NOTE = 10_000
MAX_SAVED_TITLE = 100
MAX_SAVED_TEXT = 5_000


@dataclass(frozen=True, slots=True)
class Note:
    id: int
    conversation_id: int
    author: str
    text: str
    created_at: datetime


@dataclass(frozen=True, slots=True)
class SavedReply:
    id: int
    agent_id: int
    title: str
    text: str
    created_at: datetime


def fill_placeholders(text: str, values: dict[str, str]) -> str:
    """A saved reply as sent: ``{{customer_name}}``, ``{{agent_name}}`` filled in."""
    for name, value in values.items():
        text = text.replace("{{" + name + "}}", value)
    return text


def _label(label: str) -> str:
    value = " ".join(label.split())
    if not 1 <= len(value) <= MAX_LABEL:
        raise InvalidInput(f"label: give 1-{MAX_LABEL} characters")
    return value


async def _announce(conn: Any, conversation_id: int, kind: str, **extra: Any) -> None:
    """Tell the feed's listeners (live lists, the widget's stream) about this conversation."""
    row = await conn.fetchrow(
        """UPDATE conversations SET inbox_changed_at = now() WHERE id = $1
           RETURNING id, agent_id, channel, conversation_key""",
        conversation_id,
    )
    if row is None:
        raise NotFound(f"no conversation {conversation_id}")
    payload = {
        "conversation_id": row["id"],
        "agent_id": row["agent_id"],
        "channel": row["channel"],
        "key": row["conversation_key"],
        "message_id": None,
        "kind": kind,
        **extra,
    }
    await conn.execute("SELECT pg_notify($1, $2)", FEED_CHANNEL, json.dumps(payload))


class InboxWork:
    def __init__(self, pool: asyncpg.Pool) -> None:
        self._pool = pool

    async def watermark(self) -> str:
        """Changes when anything the conversation list shows changes (new message, status,
        assignment, label, a conversation read)."""
        value = await self._pool.fetchval(
            """SELECT concat_ws('|', (SELECT max(id) FROM messages),
                      (SELECT max(inbox_changed_at) FROM conversations),
                      (SELECT max(read_at) FROM conversation_reads))"""
        )
        return str(value or "")

    async def mark_read(self, conversation_id: int, reader: str) -> None:
        await self._pool.execute(
            """INSERT INTO conversation_reads (conversation_id, reader) VALUES ($1, $2)
               ON CONFLICT (conversation_id, reader) DO UPDATE SET read_at = now()""",
            conversation_id,
            reader,
        )

    async def set_status(self, conversation_id: int, status: str, staff: str) -> None:
        """Set open, pending or resolved. Resolving records who resolved it and when (what
        the reports count); resolving what is resolved already records nothing more."""
        if status not in INBOX_STATUSES:
            raise InvalidInput(f"status: one of {', '.join(INBOX_STATUSES)}")
        async with self._pool.acquire() as conn, conn.transaction():
            # Locked, so two staff resolving at once record one resolving, not two.
            was = await conn.fetchval(
                "SELECT inbox_status FROM conversations WHERE id = $1 FOR UPDATE",
                conversation_id,
            )
            if was is None:
                raise NotFound(f"no conversation {conversation_id}")
            await conn.execute(
                "UPDATE conversations SET inbox_status = $2 WHERE id = $1",
                conversation_id,
                status,
            )
            if status == "resolved" and was != "resolved":
                await conn.execute(
                    """INSERT INTO conversation_resolutions (conversation_id, staff)
                       VALUES ($1, $2)""",
                    conversation_id,
                    staff,
                )
            await _announce(conn, conversation_id, "inbox")

    async def assign(self, conversation_id: int, staff_id: int | None) -> None:
        async with self._pool.acquire() as conn, conn.transaction():
            if staff_id is not None:
                enabled = await conn.fetchval(
                    "SELECT disabled_at IS NULL FROM staff WHERE id = $1", staff_id
                )
                if enabled is None:
                    raise InvalidInput(f"staff_id: there is no staff account {staff_id}")
                if not enabled:
                    raise Conflict("that staff account is disabled")
            await conn.execute(
                "UPDATE conversations SET assignee_id = $2 WHERE id = $1",
                conversation_id,
                staff_id,
            )
            await _announce(conn, conversation_id, "inbox")

    async def add_label(self, conversation_id: int, label: str) -> None:
        async with self._pool.acquire() as conn, conn.transaction():
            await _announce(conn, conversation_id, "inbox")
            await conn.execute(
                """INSERT INTO conversation_labels (conversation_id, label) VALUES ($1, $2)
                   ON CONFLICT DO NOTHING""",
                conversation_id,
                _label(label),
            )

    async def remove_label(self, conversation_id: int, label: str) -> None:
        async with self._pool.acquire() as conn, conn.transaction():
            await _announce(conn, conversation_id, "inbox")
            await conn.execute(
                "DELETE FROM conversation_labels WHERE conversation_id = $1 AND label = $2",
                conversation_id,
                " ".join(label.split()),
            )

    async def labels_in_use(self, agent_id: int | None = None) -> list[str]:
        """Labels on any conversation, or (``agent_id``) on that agent's conversations."""
        rows = await self._pool.fetch(
            """SELECT DISTINCT l.label FROM conversation_labels l
                 JOIN conversations c ON c.id = l.conversation_id
                WHERE $1::bigint IS NULL OR c.agent_id = $1
                ORDER BY l.label LIMIT 200""",
            agent_id,
        )
        return [r["label"] for r in rows]

    async def add_note(self, conversation_id: int, text: str, author: str) -> Note:
        body = text.strip()
        if not 1 <= len(body) <= MAX_NOTE:
            raise InvalidInput(f"text: a note needs 1-{MAX_NOTE} characters")
        async with self._pool.acquire() as conn, conn.transaction():
            await _announce(conn, conversation_id, "inbox")
            row = await conn.fetchrow(
                """INSERT INTO conversation_notes (conversation_id, author, text)
                   VALUES ($1, $2, $3)
                   RETURNING id, conversation_id, author, text, created_at""",
                conversation_id,
                author,
                body,
            )
        assert row is not None  # INSERT ... RETURNING gives the row
        return Note(**dict(row))

    async def notes(self, conversation_id: int) -> list[Note]:
        rows = await self._pool.fetch(
            """SELECT id, conversation_id, author, text, created_at FROM conversation_notes
                WHERE conversation_id = $1 ORDER BY id""",
            conversation_id,
        )
        return [Note(**dict(r)) for r in rows]

    async def typing(self, conversation_id: int, staff_name: str) -> None:
        """Announce that staff are writing in the conversation (shown in the widget)."""
        async with self._pool.acquire() as conn:
            row = await conn.fetchrow(
                "SELECT id, agent_id, channel, conversation_key FROM conversations WHERE id = $1",
                conversation_id,
            )
            if row is None:
                raise NotFound(f"no conversation {conversation_id}")
            payload = {
                "conversation_id": row["id"],
                "agent_id": row["agent_id"],
                "channel": row["channel"],
                "key": row["conversation_key"],
                "message_id": None,
                "kind": "typing",
                "staff": staff_name[:100],
            }
            await conn.execute("SELECT pg_notify($1, $2)", FEED_CHANNEL, json.dumps(payload))

    async def saved_replies(self, agent_id: int) -> list[SavedReply]:
        rows = await self._pool.fetch(
            """SELECT id, agent_id, title, text, created_at FROM saved_replies
                WHERE agent_id = $1 ORDER BY title""",
            agent_id,
        )
        return [SavedReply(**dict(r)) for r in rows]

    async def add_saved_reply(self, agent_id: int, title: str, text: str) -> SavedReply:
        title, text = title.strip(), text.strip()
        if not 1 <= len(title) <= MAX_SAVED_TITLE:
            raise InvalidInput(f"title: give 1-{MAX_SAVED_TITLE} characters")
        if not 1 <= len(text) <= MAX_SAVED_TEXT:
            raise InvalidInput(f"text: give 1-{MAX_SAVED_TEXT} characters")
        try:
            row = await self._pool.fetchrow(
                """INSERT INTO saved_replies (agent_id, title, text) VALUES ($1, $2, $3)
                   RETURNING id, agent_id, title, text, created_at""",
                agent_id,
                title,
                text,
            )
        except asyncpg.UniqueViolationError:
            raise Conflict(f"there is already a saved reply called {title!r}") from None
        assert row is not None  # INSERT ... RETURNING gives the row
        return SavedReply(**dict(row))

    async def delete_saved_reply(self, agent_id: int, reply_id: int) -> None:
        done = await self._pool.execute(
            "DELETE FROM saved_replies WHERE agent_id = $1 AND id = $2", agent_id, reply_id
        )
        if done.endswith(" 0"):
            raise NotFound(f"no saved reply {reply_id}")
