"""Handoff in Postgres: a conversation's status, staff and system messages, and their NOTIFY.

Every change a follower of a conversation should see (a staff reply, a status change, a
visitor message while staff have the conversation) is announced with ``pg_notify`` on
`FEED_CHANNEL` in the transaction that stores it, so it is announced exactly when it is
committed, to every process listening on the database.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

import asyncpg

from core.errors import InvalidInput, NotFound
from core.store.outbox import enqueue

FEED_CHANNEL = "parley_conversations"
# Staff reach a visitor live on the widget, and on a messaging channel by sending; never
# on these, answered within the request with no way to write back later.
LIVE_CHANNEL = "web"
UNREACHABLE = frozenset({"api", "playground", "test"})
Status = Literal["bot", "waiting_for_staff", "staff"]
# A handoff's system message holds the new status as its text.
STATUSES: tuple[Status, ...] = ("bot", "waiting_for_staff", "staff")

_STATE_COLUMNS = (
    "id, agent_id, channel, conversation_key, status, assigned_to, generation, "
    "(SELECT max(m.created_at) FROM messages m WHERE m.conversation_id = conversations.id "
    "AND m.role = 'visitor') AS customer_wrote_at"
)


@dataclass(frozen=True, slots=True)
class ConversationState:
    id: int
    agent_id: int
    channel: str
    conversation_key: str
    status: str
    assigned_to: str | None
    generation: int
    customer_wrote_at: datetime | None = None  # the visitor's last message

    @property
    def held(self) -> bool:
        """Staff have it, or the visitor is waiting for them: the bot keeps quiet."""
        return self.status != "bot"


@dataclass(frozen=True, slots=True)
class FeedMessage:
    """What a follower of a conversation is shown: a staff message or a status change."""

    id: int
    role: Literal["staff", "system"]
    text: str
    author: str | None
    created_at: datetime


@dataclass(frozen=True, slots=True)
class HeldTurn:
    conversation_id: int
    turn_id: int
    message_id: int | None


def _state(row: asyncpg.Record | None) -> ConversationState | None:
    return ConversationState(**dict(row)) if row is not None else None


async def _notify(conn: Any, state: ConversationState, message_id: int | None, kind: str) -> None:
    payload = {
        "conversation_id": state.id,
        "agent_id": state.agent_id,
        "channel": state.channel,
        "key": state.conversation_key,
        "message_id": message_id,
        "kind": kind,
    }
    await conn.execute("SELECT pg_notify($1, $2)", FEED_CHANNEL, json.dumps(payload))


async def _add(
    conn: Any,
    state: ConversationState,
    role: str,
    text: str,
    author: str | None,
    turn_id: int | None = None,
) -> int:
    message_id: int = await conn.fetchval(
        """INSERT INTO messages (conversation_id, role, text, author, turn_id, generation)
           VALUES ($1, $2, $3, $4, $5, $6) RETURNING id""",
        state.id,
        role,
        text,
        author,
        turn_id,
        state.generation,
    )
    return message_id


class HandoffStore:
    def __init__(self, pool: asyncpg.Pool) -> None:
        self._pool = pool

    async def state(self, agent_id: int, channel: str, key: str) -> ConversationState | None:
        return _state(
            await self._pool.fetchrow(
                f"""SELECT {_STATE_COLUMNS} FROM conversations
                     WHERE agent_id = $1 AND channel = $2 AND conversation_key = $3""",
                agent_id,
                channel,
                key,
            )
        )

    async def conversation(self, conversation_id: int) -> ConversationState:
        found = _state(
            await self._pool.fetchrow(
                f"SELECT {_STATE_COLUMNS} FROM conversations WHERE id = $1", conversation_id
            )
        )
        if found is None:
            raise NotFound(f"no conversation {conversation_id}")
        return found

    async def hold(
        self,
        *,
        agent_id: int,
        channel: str,
        key: str,
        question: str,
        save_question: bool,
        language: str | None,
        trace: dict[str, Any],
    ) -> HeldTurn:
        """A visitor's message the bot does not answer: stored for staff as a turn without an
        answer (so a durable channel that redoes the turn can discard it whole)."""
        async with self._pool.acquire() as conn, conn.transaction():
            state = _state(
                await conn.fetchrow(
                    f"""INSERT INTO conversations (agent_id, channel, conversation_key, language)
                        VALUES ($1, $2, $3, $4)
                        ON CONFLICT (agent_id, channel, conversation_key) DO UPDATE
                           SET last_message_at = now(),
                               language = COALESCE(EXCLUDED.language, conversations.language)
                        RETURNING {_STATE_COLUMNS}""",
                    agent_id,
                    channel,
                    key,
                    language,
                )
            )
            assert state is not None
            turn_id: int = await conn.fetchval(
                """INSERT INTO turns (conversation_id, agent_id, channel, query, mode, trace)
                   VALUES ($1, $2, $3, $4, 'staff', $5) RETURNING id""",
                state.id,
                agent_id,
                channel,
                question,
                trace,
            )
            message_id = None
            if save_question:
                message_id = await _add(conn, state, "visitor", question, None, turn_id)
            await _notify(conn, state, message_id, "visitor")
        return HeldTurn(state.id, turn_id, message_id)

    async def change_status(
        self,
        conversation_id: int,
        status: Status,
        *,
        author: str | None,
        unless: Sequence[str] = (),
    ) -> bool:
        """Move a conversation to ``status`` (left as it is when its status is in ``unless``),
        with a system message saying so; False when nothing changed."""
        async with self._pool.acquire() as conn, conn.transaction():
            state = _state(
                await conn.fetchrow(
                    f"SELECT {_STATE_COLUMNS} FROM conversations WHERE id = $1 FOR UPDATE",
                    conversation_id,
                )
            )
            if state is None:
                raise NotFound(f"no conversation {conversation_id}")
            return await self._change(conn, state, status, author, unless)

    async def _change(
        self,
        conn: Any,
        state: ConversationState,
        status: Status,
        author: str | None,
        unless: Sequence[str],
    ) -> bool:
        assigned = author if status == "staff" else None
        if state.status in unless or (state.status, state.assigned_to) == (status, assigned):
            return False
        await conn.execute(
            """UPDATE conversations SET status = $2, assigned_to = $3, status_changed_at = now()
                WHERE id = $1""",
            state.id,
            status,
            assigned,
        )
        message_id = await _add(conn, state, "system", status, author)
        await _notify(conn, state, message_id, "status")
        return True

    async def add_staff_reply(
        self,
        conversation_id: int,
        text: str,
        staff: str,
        split: Callable[[ConversationState, str], list[str] | None],
        *,
        template: Mapping[str, Any] | None = None,
    ) -> int:
        """Store what staff wrote and queue it for the visitor's channel, in one transaction.

        Replying takes the conversation over when staff had not yet, so the bot never answers
        alongside a person. ``split(state, text)`` gives the parts a messaging app is sent
        (None: the channel is not a messaging channel); it may refuse the reply by raising,
        before anything is stored. ``template`` is sent instead of the text (WhatsApp outside
        its 24-hour window): the text stored is the template's, filled in.
        """
        async with self._pool.acquire() as conn, conn.transaction():
            state = _state(
                await conn.fetchrow(
                    f"SELECT {_STATE_COLUMNS} FROM conversations WHERE id = $1 FOR UPDATE",
                    conversation_id,
                )
            )
            if state is None:
                raise NotFound(f"no conversation {conversation_id}")
            parts = split(state, text)
            if parts is None and state.channel != LIVE_CHANNEL:
                raise InvalidInput(f"staff cannot reach a visitor on the {state.channel} channel")
            if state.status != "staff":
                await self._change(conn, state, "staff", staff, ())
            message_id = await _add(conn, state, "staff", text, staff)
            await conn.execute(
                "UPDATE conversations SET last_message_at = now() WHERE id = $1", state.id
            )
            if parts is not None:
                await enqueue(
                    conn,
                    agent_id=state.agent_id,
                    channel=state.channel,
                    recipient=state.conversation_key,
                    parts=[text] if template is not None else parts,
                    conversation_id=state.id,
                    message_id=message_id,
                    template=template,
                )
            await _notify(conn, state, message_id, "staff")
        return message_id

    async def feed_since(
        self, agent_id: int, channel: str, key: str, after: int, limit: int = 100
    ) -> list[FeedMessage]:
        """Staff messages and status changes after message ``after``, oldest first."""
        rows = await self._pool.fetch(
            """SELECT m.id, m.role, m.text, m.author, m.created_at
                 FROM messages m JOIN conversations c ON c.id = m.conversation_id
                WHERE c.agent_id = $1 AND c.channel = $2 AND c.conversation_key = $3
                  AND m.id > $4 AND m.generation = c.generation
                  AND (m.role = 'staff' OR (m.role = 'system' AND m.text = ANY($5::text[])))
                ORDER BY m.id
                LIMIT $6""",
            agent_id,
            channel,
            key,
            after,
            list(STATUSES),
            limit,
        )
        return [FeedMessage(**dict(r)) for r in rows]

    async def last_message_id(self, agent_id: int, channel: str, key: str) -> int:
        """The newest message of the conversation (0 when there is none): where "from now
        on" starts."""
        found: int | None = await self._pool.fetchval(
            """SELECT max(m.id) FROM messages m JOIN conversations c ON c.id = m.conversation_id
                WHERE c.agent_id = $1 AND c.channel = $2 AND c.conversation_key = $3""",
            agent_id,
            channel,
            key,
        )
        return found or 0
