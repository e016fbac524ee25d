"""Support reports: per day and channel, what the bot answered, what staff took, how fast.

Everything is counted from what the turns and staff already left behind (messages, turns and
their traces, handoff system messages, resolutions, feedback), in the agent's time zone, so a
report needs no counters of its own and can be asked for any past period.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date, datetime, time, timedelta
from typing import Any
from zoneinfo import ZoneInfo

import asyncpg

# Conversations staff or the nightly checks have with the agent, not customers.
REHEARSAL_CHANNELS = ("playground", "test")

# The trace key (`turns.trace->'timings_ms'`) the pipeline records when the model's first
# token arrived, in milliseconds from the start of generation (core/answer/pipeline.py).
FIRST_TOKEN_KEY = "first_token"  # noqa: S105 (a trace key, not a secret)

# Turns in which the bot answered no question: staff held them, the visitor asked for a
# person, said hello or thanks, or had run out of quota (core/answer/quotas.py).
NO_ANSWER_MODES = ("staff", "handoff", "smalltalk", "quota")

# Feedback (migration 0013): a thumbs up or down on a turn. Read only once the table exists.
_FEEDBACK_FACTS = """
    UNION ALL
    SELECT {day} AS day, {channel} AS channel,
           CASE WHEN f.rating = 'up' THEN 'up' ELSE 'down' END, t.conversation_id, NULL::float8
      FROM feedback f JOIN turns t ON t.id = f.turn_id
     WHERE t.agent_id = $1 AND NOT (t.channel = ANY($5::text[]))
       AND f.rating IN ('up', 'down') AND f.created_at >= $3 AND f.created_at < $4"""


def _bucket(column: str) -> tuple[str, str]:
    """The day (NULL for the whole period) and channel (NULL for all) a fact counts under."""
    return (
        f"CASE WHEN $6 THEN ({column} AT TIME ZONE $2)::date END",
        "CASE WHEN $7 THEN c.channel END",
    )


def _facts(feedback: bool) -> str:
    # Each fact is (day, channel, kind, conversation_id, value); the figures are aggregates
    # over them, so a day and a whole period are counted by the very same query.
    visit_day, channel = _bucket("m.created_at")
    turn_day, _ = _bucket("t.created_at")
    resolved_day, _ = _bucket("r.resolved_at")
    staff_day, _ = _bucket("s.created_at")
    feedback_facts = ""
    if feedback:
        feedback_day, _ = _bucket("f.created_at")
        feedback_facts = _FEEDBACK_FACTS.format(
            day=feedback_day, channel="CASE WHEN $7 THEN t.channel END"
        )
    no_answer = ", ".join(f"'{mode}'" for mode in NO_ANSWER_MODES)  # constants, no input
    return f"""
    WITH scope AS (
        SELECT c.id, c.channel FROM conversations c
         WHERE c.agent_id = $1 AND NOT (c.channel = ANY($5::text[]))
    ),
    base AS (
        -- a visitor wrote: the conversation was open that day
        SELECT {visit_day} AS day, {channel} AS channel, 'visit' AS kind,
               m.conversation_id, NULL::float8 AS value
          FROM messages m JOIN scope c ON c.id = m.conversation_id
         WHERE m.role = 'visitor' AND m.created_at >= $3 AND m.created_at < $4
        UNION ALL
        -- a visitor's message the bot answered (a held message's turn has mode 'staff')
        SELECT {visit_day}, {channel}, 'question', m.conversation_id, NULL
          FROM messages m JOIN scope c ON c.id = m.conversation_id
          JOIN turns t ON t.id = m.turn_id
         WHERE m.role = 'visitor' AND t.mode <> 'staff'
           AND m.created_at >= $3 AND m.created_at < $4
        UNION ALL
        -- handed to staff: asked for a person, or taken over
        SELECT {visit_day}, {channel}, 'handoff', m.conversation_id, NULL
          FROM messages m JOIN scope c ON c.id = m.conversation_id
         WHERE m.role = 'system' AND m.text IN ('waiting_for_staff', 'staff')
           AND m.created_at >= $3 AND m.created_at < $4
        UNION ALL
        -- staff resolved it (migration 0017); resolved again another day counts that day too
        SELECT {resolved_day}, {channel}, 'resolved', r.conversation_id, NULL
          FROM conversation_resolutions r JOIN scope c ON c.id = r.conversation_id
         WHERE r.resolved_at >= $3 AND r.resolved_at < $4
        UNION ALL
        -- an answer of the bot's, and whether the answer cache gave it (mode 'cached')
        SELECT {turn_day}, {channel},
               CASE WHEN t.mode = 'cached' THEN 'cached' ELSE 'answered' END,
               t.conversation_id, NULL
          FROM turns t JOIN scope c ON c.id = t.conversation_id
         WHERE t.created_at >= $3 AND t.created_at < $4
           AND t.mode NOT IN ({no_answer})
        UNION ALL
        SELECT {turn_day}, {channel}, 'first_token', t.conversation_id,
               (t.trace -> 'timings_ms' ->> '{FIRST_TOKEN_KEY}')::float8
          FROM turns t JOIN scope c ON c.id = t.conversation_id
         WHERE t.created_at >= $3 AND t.created_at < $4
           AND jsonb_typeof(t.trace -> 'timings_ms' -> '{FIRST_TOKEN_KEY}') = 'number'
        UNION ALL
        -- staff's first response: from the first visitor message after the last answer
        -- (staff's, or the bot's other than "a person will come") to the staff message
        SELECT {staff_day}, {channel}, 'staff_response', s.conversation_id,
               extract(epoch FROM s.created_at - waited.since)::float8
          FROM messages s JOIN scope c ON c.id = s.conversation_id
          CROSS JOIN LATERAL (
              SELECT max(r.id) AS id FROM messages r LEFT JOIN turns rt ON rt.id = r.turn_id
               WHERE r.conversation_id = s.conversation_id AND r.generation = s.generation
                 AND r.id < s.id
                 AND (r.role = 'staff'
                      OR (r.role = 'assistant' AND coalesce(rt.mode, '') <> 'handoff'))
          ) answered
          CROSS JOIN LATERAL (
              SELECT min(v.created_at) AS since FROM messages v
               WHERE v.conversation_id = s.conversation_id AND v.generation = s.generation
                 AND v.role = 'visitor' AND v.id < s.id AND v.id > coalesce(answered.id, 0)
          ) waited
         WHERE s.role = 'staff' AND waited.since IS NOT NULL
           AND s.created_at >= $3 AND s.created_at < $4
        {feedback_facts}
    ),
    facts AS (
        SELECT * FROM base
        UNION ALL
        -- answered by the bot alone: open that day (or period) and never handed to staff in it
        SELECT v.day, v.channel, 'deflected', v.conversation_id, NULL FROM base v
         WHERE v.kind = 'visit' AND NOT EXISTS (
               SELECT 1 FROM base h WHERE h.kind = 'handoff'
                  AND h.conversation_id = v.conversation_id AND h.day IS NOT DISTINCT FROM v.day)
    )
    SELECT day, channel,
           count(DISTINCT conversation_id) FILTER (WHERE kind = 'visit') AS conversations,
           count(*) FILTER (WHERE kind = 'question') AS questions,
           count(DISTINCT conversation_id) FILTER (WHERE kind = 'deflected') AS deflected,
           count(DISTINCT conversation_id) FILTER (WHERE kind = 'handoff') AS handed_to_staff,
           count(DISTINCT conversation_id) FILTER (WHERE kind = 'resolved') AS resolved,
           count(*) FILTER (WHERE kind = 'up') AS thumbs_up,
           count(*) FILTER (WHERE kind = 'down') AS thumbs_down,
           percentile_cont(0.5) WITHIN GROUP (ORDER BY value)
               FILTER (WHERE kind = 'first_token') AS first_token_ms_median,
           percentile_cont(0.9) WITHIN GROUP (ORDER BY value)
               FILTER (WHERE kind = 'first_token') AS first_token_ms_p90,
           percentile_cont(0.5) WITHIN GROUP (ORDER BY value)
               FILTER (WHERE kind = 'staff_response') AS staff_first_response_s_median,
           count(*) FILTER (WHERE kind IN ('answered', 'cached')) AS answered,
           count(*) FILTER (WHERE kind = 'cached') AS cached
      FROM facts
     GROUP BY day, channel
     ORDER BY day NULLS FIRST, channel NULLS FIRST"""


@dataclass(frozen=True, slots=True)
class Figures:
    """One day's (or the period's, ``day`` None) figures on one channel (None: all)."""

    day: date | None
    channel: str | None
    conversations: int
    questions: int
    deflected: int
    handed_to_staff: int
    resolved: int
    thumbs_up: int
    thumbs_down: int
    first_token_ms_median: float | None
    first_token_ms_p90: float | None
    staff_first_response_s_median: float | None
    answered: int = 0  # answers the bot gave (from the model, curated, cached...)
    cached: int = 0  # of those, from the answer cache

    @property
    def thumbs_up_rate(self) -> float | None:
        rated = self.thumbs_up + self.thumbs_down
        return self.thumbs_up / rated if rated else None

    @property
    def cache_hit_rate(self) -> float | None:
        """Answers from the answer cache / all the bot's answers; None: it answered none."""
        return self.cached / self.answered if self.answered else None


@dataclass(frozen=True, slots=True)
class Report:
    first_day: date
    last_day: date  # inclusive
    timezone: str
    days: tuple[Figures, ...]  # per day and channel; a day or channel without any is left out
    channels: tuple[Figures, ...]  # per channel over the whole period
    total: Figures  # all channels over the whole period
    feedback_recorded: bool  # False: there is no feedback table yet


def period_bounds(first_day: date, last_day: date, timezone: str) -> tuple[datetime, datetime]:
    """The period's start and end (exclusive) as moments: midnights in the agent's zone."""
    zone = ZoneInfo(timezone)
    start = datetime.combine(first_day, time(), zone)
    end = datetime.combine(last_day + timedelta(days=1), time(), zone)
    return start, end


def _figures(row: asyncpg.Record) -> Figures:
    values: dict[str, Any] = {
        k: (round(v, 2) if isinstance(v, float) else v) for k, v in row.items()
    }
    return Figures(**values)


class Reports:
    def __init__(self, pool: asyncpg.Pool) -> None:
        self._pool = pool

    async def feedback_recorded(self) -> bool:
        return bool(await self._pool.fetchval("SELECT to_regclass('feedback') IS NOT NULL"))

    async def report(self, agent_id: int, timezone: str, first_day: date, last_day: date) -> Report:
        start, end = period_bounds(first_day, last_day, timezone)
        feedback = await self.feedback_recorded()
        query = _facts(feedback)
        args = (agent_id, timezone, start, end, list(REHEARSAL_CHANNELS))
        async with self._pool.acquire() as conn:
            days = await conn.fetch(query, *args, True, True)
            channels = await conn.fetch(query, *args, False, True)
            total = await conn.fetch(query, *args, False, False)
        empty = Figures(None, None, 0, 0, 0, 0, 0, 0, 0, None, None, None)
        return Report(
            first_day=first_day,
            last_day=last_day,
            timezone=timezone,
            days=tuple(_figures(r) for r in days),
            channels=tuple(_figures(r) for r in channels),
            total=_figures(total[0]) if total else empty,
            feedback_recorded=feedback,
        )
