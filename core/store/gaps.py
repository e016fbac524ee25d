"""Content gaps as staff see them: open questions grouped by meaning, resolved a group at once."""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

import asyncpg
import numpy as np
from numpy.typing import NDArray

from core.ports import Embedder

# With the bundled encoder a paraphrase scores about 0.7 and above, a different question on
# the same topic about 0.5 (see core/answer/curated.py), so this keeps topics apart.
SIMILAR_QUESTION = 0.7
MAX_OPEN = 2000  # newest open gaps grouped; older ones wait until these are resolved
MAX_EXAMPLES = 5
MAX_FEEDBACK = 5  # thumbs-down answers shown per group, newest first
MAX_FEEDBACK_SOURCES = 5


@dataclass(frozen=True, slots=True)
class Gap:
    id: int
    question: str
    language: str | None
    reason: str
    confidence: float | None
    created_at: datetime


@dataclass(frozen=True, slots=True)
class GapSource:
    title: str
    url: str


@dataclass(frozen=True, slots=True)
class GapFeedback:
    """A thumbs-down on an answer: what was asked, what the agent said and cited, and why."""

    gap_id: int
    question: str
    answer: str
    sources: tuple[GapSource, ...]
    comment: str | None
    created_at: datetime


@dataclass(frozen=True, slots=True)
class GapGroup:
    """Questions asking the same thing; ``gap_ids`` is what resolving the group resolves."""

    question: str  # the most asked wording
    count: int
    examples: tuple[str, ...]  # distinct wordings, most asked first
    languages: tuple[str, ...]
    gap_ids: tuple[int, ...]
    first_seen: datetime
    last_seen: datetime
    reasons: tuple[str, ...] = ()  # weak_match, deferred, thumbs_down: why the group is here
    feedback: tuple[GapFeedback, ...] = ()

    @property
    def key(self) -> int:
        """The group's newest gap: a stable handle while the group is unchanged."""
        return self.gap_ids[0]


def normalise_question(text: str) -> str:
    """Case, accents, punctuation and spacing removed: "Shipping cost?" == "shipping  cost"."""
    folded = unicodedata.normalize("NFKD", text.casefold())
    letters = "".join(c for c in folded if not unicodedata.combining(c))
    return " ".join(re.sub(r"[^\w\s]", " ", letters).split())


def group_gaps(
    gaps: Sequence[Gap],
    vectors: NDArray[np.float32] | None,
    threshold: float = SIMILAR_QUESTION,
) -> list[GapGroup]:
    """Same normalised text always groups; with ``vectors`` (one row per gap) questions whose
    similarity to a group's centroid reaches ``threshold`` join it too. Newest gaps lead."""
    order = sorted(range(len(gaps)), key=lambda i: (gaps[i].created_at, gaps[i].id), reverse=True)
    members: list[list[int]] = []
    by_text: dict[str, int] = {}
    centroids: list[NDArray[np.float32]] = []
    for i in order:
        text = normalise_question(gaps[i].question)
        group = by_text.get(text)
        if group is None and vectors is not None and centroids:
            similarities = np.vstack(centroids) @ vectors[i]
            best = int(np.argmax(similarities))
            if float(similarities[best]) >= threshold:
                group = best
        if group is None:
            group = len(members)
            members.append([])
            centroids.append(vectors[i] if vectors is not None else np.zeros(1, dtype=np.float32))
        elif vectors is not None:
            total = centroids[group] * len(members[group]) + vectors[i]
            centroids[group] = total / max(float(np.linalg.norm(total)), 1e-9)
        members[group].append(i)
        by_text.setdefault(text, group)
    groups = [_group([gaps[i] for i in indexes]) for indexes in members]
    return sorted(groups, key=lambda g: (g.count, g.last_seen), reverse=True)


def _group(gaps: list[Gap]) -> GapGroup:
    wordings: dict[str, tuple[int, str]] = {}
    for gap in gaps:  # newest first: each wording is shown as it was first asked
        text = normalise_question(gap.question)
        count, _ = wordings.get(text, (0, ""))
        wordings[text] = (count + 1, gap.question.strip())
    ranked = sorted(wordings.values(), key=lambda w: w[0], reverse=True)
    return GapGroup(
        question=ranked[0][1],
        count=len(gaps),
        examples=tuple(w[1] for w in ranked[:MAX_EXAMPLES]),
        languages=tuple(sorted({g.language for g in gaps if g.language})),
        gap_ids=tuple(g.id for g in gaps),
        first_seen=min(g.created_at for g in gaps),
        last_seen=max(g.created_at for g in gaps),
        reasons=tuple(sorted({g.reason for g in gaps})),
    )


def _shown_sources(trace: Any) -> tuple[GapSource, ...]:
    """The sources the visitor saw under the answer: those it cited (all it was given when it
    cited none), as the turn's trace recorded them."""
    if not isinstance(trace, dict):
        return ()
    given = [s for s in trace.get("sources") or [] if isinstance(s, dict) and s.get("url")]
    cited = {str(n) for n in (trace.get("cited_sources") or {}).values()}
    shown = [s for s in given if str(s.get("id")) in cited] if cited else given
    return tuple(
        GapSource(str(s.get("title") or s["url"]), str(s["url"]))
        for s in shown[:MAX_FEEDBACK_SOURCES]
    )


class ContentGaps:
    def __init__(self, pool: asyncpg.Pool) -> None:
        self._pool = pool

    async def grouped(self, agent_id: int, embedder: Embedder | None) -> list[GapGroup]:
        """The agent's open gaps in groups, most asked first.

        Each question is embedded once and the vector kept with it; without an embedder,
        only questions worded alike (after `normalise_question`) share a group.
        """
        rows = await self._pool.fetch(
            """SELECT id, question, language, reason, confidence, created_at,
                      CASE WHEN question_embedder = $3 THEN question_embedding END AS vector
                 FROM content_gaps WHERE agent_id = $1 AND resolved_at IS NULL
                ORDER BY created_at DESC, id DESC LIMIT $2""",
            agent_id,
            MAX_OPEN,
            embedder.name if embedder is not None else None,
        )
        gaps = [Gap(*(r[k] for k in Gap.__dataclass_fields__)) for r in rows]
        return await self._with_feedback(await self._group(gaps, rows, embedder))

    async def _group(
        self, gaps: list[Gap], rows: Sequence[asyncpg.Record], embedder: Embedder | None
    ) -> list[GapGroup]:
        if embedder is None or not gaps:
            return group_gaps(gaps, None)
        missing = [i for i, r in enumerate(rows) if r["vector"] is None]
        vectors: list[NDArray[np.float32] | None] = [
            np.asarray(r["vector"].to_numpy(), dtype=np.float32)
            if r["vector"] is not None
            else None
            for r in rows
        ]
        if missing:
            fresh = await embedder.embed([gaps[i].question for i in missing])
            for i, vector in zip(missing, fresh, strict=True):
                vectors[i] = vector
            await self._pool.executemany(
                """UPDATE content_gaps SET question_embedding = $2, question_embedder = $3
                    WHERE id = $1""",
                [(gaps[i].id, vectors[i], embedder.name) for i in missing],
            )
        return group_gaps(gaps, np.vstack([v for v in vectors if v is not None]))

    async def _with_feedback(self, groups: list[GapGroup]) -> list[GapGroup]:
        """Each group's thumbs-down answers, with the visitor's comment."""
        wanted = [g for g in groups if "thumbs_down" in g.reasons]
        if not wanted:
            return groups
        rows = await self._pool.fetch(
            """SELECT g.id, coalesce(t.query, g.question) AS question, t.trace, f.comment,
                      coalesce(f.created_at, g.created_at) AS created_at,
                      (SELECT m.text FROM messages m
                        WHERE m.turn_id = g.turn_id AND m.role = 'assistant'
                        ORDER BY m.id DESC LIMIT 1) AS answer
                 FROM content_gaps g
                 LEFT JOIN turns t ON t.id = g.turn_id
                 LEFT JOIN feedback f ON f.turn_id = g.turn_id
                WHERE g.id = ANY($1::bigint[]) AND g.reason = 'thumbs_down'""",
            [i for g in wanted for i in g.gap_ids],
        )
        found = {
            r["id"]: GapFeedback(
                gap_id=r["id"],
                question=r["question"],
                answer=r["answer"] or "",
                sources=_shown_sources(r["trace"]),
                comment=r["comment"],
                created_at=r["created_at"],
            )
            for r in rows
        }
        return [
            replace(g, feedback=tuple(found[i] for i in g.gap_ids if i in found)[:MAX_FEEDBACK])
            if "thumbs_down" in g.reasons
            else g
            for g in groups
        ]

    async def resolve(self, agent_id: int, gap_ids: Sequence[int]) -> int:
        """Mark gaps resolved (a whole group at once); returns how many were still open."""
        done = await self._pool.execute(
            """UPDATE content_gaps SET resolved_at = now()
                WHERE agent_id = $1 AND id = ANY($2::bigint[]) AND resolved_at IS NULL""",
            agent_id,
            list(gap_ids),
        )
        return int(done.split()[-1])
