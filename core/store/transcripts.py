"""What staff read about conversations: the list across agents and channels, and one in full."""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal

import asyncpg

from core.errors import InvalidInput, NotFound
from core.store.database import MAX_ID

Status = Literal["bot", "waiting_for_staff", "staff"]
InboxStatus = Literal["open", "pending", "resolved"]
INBOX_STATUSES: tuple[InboxStatus, ...] = ("open", "pending", "resolved")
# Characters of the last message the list shows.
LAST_TEXT_CHARS = 120
# Trying an agent out and nightly checks make conversations too; staff see them when asked.
HIDDEN_CHANNELS = ("playground", "test")
MAX_PAGE = 200
# Characters of a paging cursor; those `encode_cursor` makes have about 70.
MAX_CURSOR = 200


@dataclass(frozen=True, slots=True)
class ConversationFilter:
    agent: str | None = None  # slug
    channel: str | None = None
    low_confidence: bool = False  # only those whose latest answer was below the threshold
    waiting: bool = False  # only those waiting for staff
    status: Status | None = None
    since: datetime | None = None  # last message at or after
    until: datetime | None = None  # last message before
    cursor: str | None = None  # `ConversationPage.next_cursor` of the previous page
    limit: int = 50
    search: str | None = None  # words in a message or the customer's name (full text)
    inbox_status: InboxStatus | None = None
    assignee_id: int | None = None  # only those assigned to this staff account
    unassigned: bool = False  # only those assigned to nobody
    label: str | None = None


@dataclass(frozen=True, slots=True)
class ConversationRow:
    id: int
    agent: str
    agent_name: str
    channel: str
    customer: str  # who it is with: the customer's name, else "@handle", else the key
    conversation_key: str  # the channel's own id of the chat
    status: str
    assigned_to: str | None  # the staff member who has it, while its status is "staff"
    language: str | None
    summary_line: str | None  # first line of the summary
    confidence: float | None  # of the latest answer
    threshold: float  # the agent's confidence threshold
    low_confidence: bool
    messages: int
    last_message_at: datetime
    created_at: datetime
    customer_name: str | None = None  # as the channel gave it
    customer_handle: str | None = None  # a user name (Telegram), without "@"
    inbox_status: str = "open"  # open, pending or resolved
    assignee_id: int | None = None  # the teammate it is assigned to
    assignee: str | None = None  # their name (else address)
    last_text: str | None = None  # the last message, cut at LAST_TEXT_CHARS
    first_question: str | None = None  # the visitor's first message: shown without a topic
    unread: bool = False  # the visitor wrote after any staff member last opened it
    labels: tuple[str, ...] = ()
    # One line on what it is about, written after the first exchange: the list shows it
    # until there is a summary.
    topic: str | None = None


@dataclass(frozen=True, slots=True)
class ConversationPage:
    items: list[ConversationRow]
    next_cursor: str | None  # None on the last page


@dataclass(frozen=True, slots=True)
class TranscriptMessage:
    id: int
    role: str
    text: str
    author: str | None  # who of the staff wrote it, or changed the status
    turn_id: int | None
    generation: int
    delivery_status: str | None
    error_code: str | None
    created_at: datetime


@dataclass(frozen=True, slots=True)
class RetrievedSource:
    url: str
    match: float | None
    score: float | None
    passed: bool
    reasons: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class TurnTrace:
    """One answered turn as the pipeline recorded it."""

    id: int
    question: str
    rewritten_query: str | None
    confidence: float | None
    low_confidence: bool
    mode: str
    created_at: datetime
    retrieved: tuple[RetrievedSource, ...]
    cited: tuple[Mapping[str, Any], ...]  # the numbered sources the prompt held
    timings_ms: Mapping[str, float]
    trace: Mapping[str, Any] = field(default_factory=dict)  # everything, for diagnostics


@dataclass(frozen=True, slots=True)
class Summary:
    text: str
    through_message: int
    updated_at: datetime


@dataclass(frozen=True, slots=True)
class ConversationDetail:
    conversation: ConversationRow
    summary: Summary | None
    messages: list[TranscriptMessage]
    turns: list[TurnTrace]


def encode_cursor(at: datetime, conversation_id: int) -> str:
    raw = f"{at.isoformat()}|{conversation_id}".encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(cursor: str) -> tuple[datetime, int]:
    """The position a cursor names; anything `encode_cursor` cannot have made is refused, so
    no made-up time or id (beyond a bigint, before year 1 in UTC) reaches the query."""
    refused = InvalidInput("cursor: not a cursor this API gave out")
    if len(cursor) > MAX_CURSOR:
        raise refused
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
        at, _, conversation_id = raw.partition("|")
        when = datetime.fromisoformat(at)
        if when.tzinfo is None:
            raise refused
        when.astimezone(UTC)  # OverflowError at the ends of the calendar
    except (ValueError, OverflowError, binascii.Error, UnicodeDecodeError):
        raise refused from None
    if not conversation_id.isdigit() or not 0 < int(conversation_id) <= MAX_ID:
        raise refused
    return when, int(conversation_id)


# The latest answered turn (staff replies have no confidence) and the summary of the
# conversation as it is now (a summary of what was cleared is not shown).
_SELECT = """
SELECT c.id, a.slug AS agent, a.name AS agent_name, c.channel,
       COALESCE(NULLIF(c.customer_name, ''), '@' || NULLIF(c.customer_handle, ''),
                c.conversation_key) AS customer,
       NULLIF(c.customer_name, '') AS customer_name,
       NULLIF(c.customer_handle, '') AS customer_handle,
       c.conversation_key, c.status, c.assigned_to, c.language,
       NULLIF(split_part(btrim(s.text, E' \\n'), E'\\n', 1), '') AS summary_line,
       t.confidence, a.confidence_threshold AS threshold,
       COALESCE(t.low_confidence OR t.confidence < a.confidence_threshold, false)
           AS low_confidence,
       (SELECT count(*) FROM messages m WHERE m.conversation_id = c.id) AS messages,
       c.last_message_at, c.created_at,
       c.inbox_status, c.assignee_id,
       COALESCE(NULLIF(st.display_name, ''), st.email) AS assignee,
       (SELECT left(m.text, 121) FROM messages m
         WHERE m.conversation_id = c.id AND m.role <> 'system'
         ORDER BY m.id DESC LIMIT 1) AS last_text,
       (SELECT left(m.text, 121) FROM messages m
         WHERE m.conversation_id = c.id AND m.role = 'visitor' AND m.generation = c.generation
         ORDER BY m.id LIMIT 1) AS first_question,
       EXISTS (SELECT 1 FROM messages m
                WHERE m.conversation_id = c.id AND m.role = 'visitor'
                  AND m.created_at > COALESCE(
                      (SELECT max(r.read_at) FROM conversation_reads r
                        WHERE r.conversation_id = c.id), '-infinity')) AS unread,
       ARRAY(SELECT l.label FROM conversation_labels l
              WHERE l.conversation_id = c.id ORDER BY l.label) AS labels,
       NULLIF(btrim(c.topic), '') AS topic
  FROM conversations c
  JOIN agents a ON a.id = c.agent_id
  LEFT JOIN staff st ON st.id = c.assignee_id
  LEFT JOIN summaries s ON s.conversation_id = c.id AND s.generation = c.generation
  LEFT JOIN LATERAL (
        SELECT confidence, low_confidence FROM turns
         WHERE conversation_id = c.id AND confidence IS NOT NULL
         ORDER BY id DESC LIMIT 1) t ON true
"""


def _row(record: asyncpg.Record) -> ConversationRow:
    row = dict(record)
    row["labels"] = tuple(row["labels"])
    for name in ("last_text", "first_question"):
        if row[name] is not None and len(row[name]) > LAST_TEXT_CHARS:
            row[name] = row[name][: LAST_TEXT_CHARS - 1].rstrip() + "…"
    return ConversationRow(**row)


def _trace(record: asyncpg.Record) -> TurnTrace:
    trace: Mapping[str, Any] = record["trace"] or {}
    retrieved = tuple(
        RetrievedSource(
            url=str(hit.get("url", "")),
            match=hit.get("match"),
            score=hit.get("score"),
            passed=bool(hit.get("passed", False)),
            reasons=tuple(hit.get("reasons") or ()),
        )
        for hit in trace.get("retrieved") or ()
        if isinstance(hit, Mapping)
    )
    return TurnTrace(
        id=record["id"],
        question=record["query"],
        rewritten_query=record["rewritten_query"] or trace.get("rewritten_query"),
        confidence=record["confidence"],
        low_confidence=record["low_confidence"],
        mode=record["mode"],
        created_at=record["created_at"],
        retrieved=retrieved,
        cited=tuple(s for s in trace.get("sources") or () if isinstance(s, Mapping)),
        timings_ms={str(k): float(v) for k, v in (trace.get("timings_ms") or {}).items()},
        trace=trace,
    )


class Transcripts:
    """Read-only: the conversation list and the conversation page of the staff console."""

    def __init__(self, pool: asyncpg.Pool) -> None:
        self._pool = pool

    async def list(self, wanted: ConversationFilter) -> ConversationPage:
        """Newest first (by last message), one page at a time (keyset pagination)."""
        limit = max(1, min(wanted.limit, MAX_PAGE))
        where: list[str] = []
        args: list[Any] = []

        def arg(value: Any) -> str:
            args.append(value)
            return f"${len(args)}"

        if wanted.agent is not None:
            where.append(f"a.slug = {arg(wanted.agent)}")
        if wanted.channel is not None:
            where.append(f"c.channel = {arg(wanted.channel)}")
        else:
            where.append(f"NOT (c.channel = ANY({arg(list(HIDDEN_CHANNELS))}::text[]))")
        if wanted.waiting:
            where.append("c.status = 'waiting_for_staff'")
        if wanted.status is not None:
            where.append(f"c.status = {arg(wanted.status)}")
        if wanted.low_confidence:
            where.append("(t.low_confidence OR t.confidence < a.confidence_threshold)")
        if wanted.since is not None:
            where.append(f"c.last_message_at >= {arg(wanted.since)}")
        if wanted.until is not None:
            where.append(f"c.last_message_at < {arg(wanted.until)}")
        if wanted.search:
            words = arg(wanted.search)
            where.append(
                f"""(to_tsvector('simple', coalesce(c.customer_name, '') || ' ' ||
                                 coalesce(c.customer_handle, '') || ' ' || c.conversation_key)
                       @@ websearch_to_tsquery('simple', {words})
                     OR EXISTS (SELECT 1 FROM messages m WHERE m.conversation_id = c.id
                                   AND to_tsvector('simple', m.text)
                                       @@ websearch_to_tsquery('simple', {words})))"""
            )
        if wanted.inbox_status is not None:
            where.append(f"c.inbox_status = {arg(wanted.inbox_status)}")
        if wanted.assignee_id is not None:
            where.append(f"c.assignee_id = {arg(wanted.assignee_id)}")
        if wanted.unassigned:
            where.append("c.assignee_id IS NULL")
        if wanted.label:
            where.append(
                "EXISTS (SELECT 1 FROM conversation_labels l WHERE l.conversation_id = c.id"
                f" AND l.label = {arg(wanted.label)})"
            )
        if wanted.cursor is not None:
            at, before_id = decode_cursor(wanted.cursor)
            where.append(f"(c.last_message_at, c.id) < ({arg(at)}, {arg(before_id)})")
        sql = (
            _SELECT
            + (" WHERE " + " AND ".join(where) if where else "")
            + f" ORDER BY c.last_message_at DESC, c.id DESC LIMIT {arg(limit + 1)}"
        )
        rows = [_row(r) for r in await self._pool.fetch(sql, *args)]
        more = len(rows) > limit
        rows = rows[:limit]
        cursor = encode_cursor(rows[-1].last_message_at, rows[-1].id) if more else None
        return ConversationPage(rows, cursor)

    async def row(self, conversation_id: int) -> ConversationRow:
        record = await self._pool.fetchrow(_SELECT + " WHERE c.id = $1", conversation_id)
        if record is None:
            raise NotFound(f"no conversation {conversation_id}")
        return _row(record)

    async def get(self, conversation_id: int, *, messages: int = 500) -> ConversationDetail:
        """A conversation with its summary, its latest ``messages`` and every turn's trace."""
        conversation = await self.row(conversation_id)
        async with self._pool.acquire() as conn:
            summary = await conn.fetchrow(
                """SELECT s.text, s.through_message, s.updated_at FROM summaries s
                     JOIN conversations c ON c.id = s.conversation_id
                    WHERE s.conversation_id = $1 AND s.generation = c.generation""",
                conversation_id,
            )
            # A message sent through a messaging channel is as far along as its outbox parts:
            # the least advanced of them, or failed when one failed (with that part's code).
            rows = await conn.fetch(
                """SELECT m.id, m.role, m.text, m.author, m.turn_id, m.generation,
                          d.status AS delivery_status, d.error_code, m.created_at
                     FROM messages m
                     LEFT JOIN LATERAL (
                          SELECT CASE
                                   WHEN bool_or(o.status = 'failed') THEN 'failed'
                                   WHEN bool_or(o.status = 'undelivered') THEN 'undelivered'
                                   WHEN bool_or(o.status IN ('pending', 'sending')) THEN 'queued'
                                   WHEN bool_or(o.status = 'sent') THEN 'sent'
                                   WHEN bool_or(o.status = 'delivered') THEN 'delivered'
                                   ELSE 'read'
                                 END AS status,
                                 max(o.error_code) FILTER (
                                     WHERE o.status IN ('failed', 'undelivered')) AS error_code
                            FROM outbox o WHERE o.message_id = m.id
                          HAVING count(*) > 0) d ON true
                    WHERE m.conversation_id = $1 ORDER BY m.id DESC LIMIT $2""",
                conversation_id,
                messages,
            )
            turns = await conn.fetch(
                """SELECT id, query, rewritten_query, confidence, low_confidence, mode, trace,
                          created_at
                     FROM turns WHERE conversation_id = $1 AND id >= $2 ORDER BY id""",
                conversation_id,
                min((r["turn_id"] for r in rows if r["turn_id"] is not None), default=0),
            )
        return ConversationDetail(
            conversation=conversation,
            summary=Summary(**dict(summary)) if summary is not None else None,
            messages=[TranscriptMessage(**dict(r)) for r in reversed(rows)],
            turns=[_trace(t) for t in turns],
        )

    async def turn(self, turn_id: int) -> TurnTrace:
        record = await self._pool.fetchrow(
            """SELECT id, query, rewritten_query, confidence, low_confidence, mode, trace,
                      created_at
                 FROM turns WHERE id = $1""",
            turn_id,
        )
        if record is None:
            raise NotFound(f"no turn {turn_id}")
        return _trace(record)
