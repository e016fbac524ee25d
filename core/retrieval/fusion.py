"""Fusing the dense and the lexical candidate lists into one ranking.

Two strategies, measured against each other by `bench/eval_retrieval.py`:

- `rrf`: reciprocal rank fusion, the usual default. It weighs both lists equally by rank,
  so when the question and the page are in different languages, the lexical list (which then
  holds only accidental word matches) pushes noise up as hard as the dense list pushes the
  right page.
- `calibrated` (the default): every candidate carries its cosine similarity to the question,
  whichever list found it, and lexical evidence is added on top, scaled by the best lexical
  rank and weighted by whether the page's language is the question's. Cross-lingual hits keep
  the dense side's strength; same-language questions still profit from exact words.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from core.knowledge.locale import language_of
from core.store.search import Candidate

Fusion = Literal["calibrated", "rrf"]

RRF_K = 60
# Weight of lexical evidence, by whether the page is in the question's language.
LEXICAL_WEIGHT_SAME = 0.25
LEXICAL_WEIGHT_OTHER = 0.05


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


def calibrated(
    dense: Sequence[Candidate], lexical: Sequence[Candidate], query_language: str | None
) -> list[Fused]:
    merged = _merge(dense, lexical)
    best_lexical = max((c.lexical for c in lexical), default=0.0) or 1.0
    fused = []
    for c in merged.values():
        same = (
            query_language is None
            or c.locale is None
            or language_of(c.locale) == language_of(query_language)
        )
        weight = LEXICAL_WEIGHT_SAME if same else LEXICAL_WEIGHT_OTHER
        fused.append(Fused(c, c.dense + weight * (c.lexical / best_lexical)))
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
