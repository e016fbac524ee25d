"""Fusing the dense and the lexical candidate lists into one ranking.

Two strategies, measured against each other by `bench/eval_retrieval.py`:

- `rrf`: reciprocal rank fusion, the usual default. It weighs both lists equally by rank,
  so when the question and the page are in different languages, the lexical list (which then
  holds only accidental word matches) pushes noise up as hard as the dense list pushes the
  right page.
- `calibrated` (the default): every candidate carries its cosine similarity to the question,
  whichever list found it, and lexical evidence is added on top, scaled by the best lexical
  rank and weighted by language. When another-language page is among the closest by meaning,
  the question's own-language pages get no lexical bonus, so cross-lingual hits keep the dense
  side's strength; otherwise same-language questions profit from exact words.
  Whatever the languages, a chunk with a heading or sentence that is the question itself,
  word for word or nearly (`Candidate.exactness`), is taken at its word and ranked above
  what is merely close in meaning: a visitor who types an FAQ question or a section title
  means that entry.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from core.locale import language_of
from core.store.search import EXACT_FROM, Candidate

Fusion = Literal["calibrated", "rrf"]

RRF_K = 60
# Weight of lexical evidence (relative to the best lexical rank), by whether the page is in
# the question's language; tuned on bench/data with bench/eval_retrieval.py.
LEXICAL_WEIGHT_SAME = 0.35
LEXICAL_WEIGHT_OTHER = 0.05
LEXICAL_WEIGHT_CROSS = 0.15
CROSS_LINGUAL_LOOKAHEAD = 3
LEXICAL_MARGIN = 0.15
# From EXACT_FROM (core.store.search) on, a heading or sentence counts as the query itself.
# Such a match earns a bonus larger than any similarity gap, doubling up to a word-for-word
# match, so that among similar FAQ questions the one typed exactly wins over one that shares
# most of its words.
EXACT_BONUS = 1.0


@dataclass(frozen=True, slots=True)
class Fused:
    candidate: Candidate
    score: float


def _merge(dense: Sequence[Candidate], lexical: Sequence[Candidate]) -> dict[int, Candidate]:
    merged = {c.chunk_id: c for c in dense}
    for c in lexical:
        merged[c.chunk_id] = c  # the lexical row carries both scores
    return merged


def rrf(dense: Sequence[Candidate], lexical: Sequence[Candidate]) -> list[Fused]:
    scores: dict[int, float] = {}
    for ranking in (dense, lexical):
        for rank, c in enumerate(ranking, start=1):
            scores[c.chunk_id] = scores.get(c.chunk_id, 0.0) + 1.0 / (RRF_K + rank)
    merged = _merge(dense, lexical)
    return sorted(
        (Fused(merged[i], s) for i, s in scores.items()), key=lambda f: f.score, reverse=True
    )


def _same_language(candidate: Candidate, query_language: str | None) -> bool:
    return (
        query_language is None
        or candidate.locale is None
        or language_of(candidate.locale) == language_of(query_language)
    )


def _exact_bonus(candidate: Candidate) -> float:
    if candidate.exactness < EXACT_FROM:
        return 0.0
    return EXACT_BONUS * (1.0 + (candidate.exactness - EXACT_FROM) / (1.0 - EXACT_FROM))


def calibrated(
    dense: Sequence[Candidate], lexical: Sequence[Candidate], query_language: str | None
) -> list[Fused]:
    merged = _merge(dense, lexical)
    best_lexical = max((c.lexical for c in lexical), default=0.0) or 1.0
    # When the semantically closest pages include one in another language, the answer may
    # well live only there: the question's own-language pages then share words with it by
    # accident of language, not of topic, so only the other-language pages may use shared
    # words (names, codes, numbers).
    leaders = sorted(merged.values(), key=lambda c: c.dense, reverse=True)[:CROSS_LINGUAL_LOOKAHEAD]
    cross_lingual = any(not _same_language(c, query_language) for c in leaders)
    closest = leaders[0].dense if leaders else 0.0
    fused = []
    for c in merged.values():
        same = _same_language(c, query_language)
        # An exact match is no accident of language, so the cross-lingual and margin rules
        # leave its word evidence alone: of two exact twins, the question's language wins.
        exact = _exact_bonus(c)
        if cross_lingual and not exact:
            weight = 0.0 if same else LEXICAL_WEIGHT_CROSS
        elif c.dense < closest - LEXICAL_MARGIN and not exact:
            weight = 0.0  # words alone never lift a page that is far off in meaning
        else:
            weight = LEXICAL_WEIGHT_SAME if same else LEXICAL_WEIGHT_OTHER
        fused.append(Fused(c, c.dense + weight * (c.lexical / best_lexical) + exact))
    return sorted(fused, key=lambda f: f.score, reverse=True)


def fuse(
    dense: Sequence[Candidate],
    lexical: Sequence[Candidate],
    query_language: str | None,
    strategy: Fusion = "calibrated",
) -> list[Fused]:
    if strategy == "rrf":
        return rrf(dense, lexical)
    return calibrated(dense, lexical, query_language)
