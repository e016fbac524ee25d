"""How much of a written answer its cited sources support: the share of its claims whose
numbers are in what it cites and whose meaning is close to a sentence there.

A model's answer is confident only as far as its sources carry it: the estimate of whether
the sources answer the question (`core.answer.confidence`) says nothing of what the model
then wrote. An answer that invents a number, or says what no cited sentence says, loses
that share of its confidence."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from core.answer.extractive import Passage, piece_vectors, split_sentences
from core.knowledge.pieces import piece_text
from core.ports import Embedder
from core.store.piece_vectors import PieceVectors

# A claim this close in meaning to a sentence of its sources says what that sentence says
# (with the bundled encoder a paraphrase scores 0.6-0.9, in another language 0.5-0.8, an
# unrelated sentence of the same page 0.1-0.4).
CLOSE = 0.45
# Sentences shorter than this say nothing to check ("Yes.", "Sure!").
CLAIM_WORDS = 3

_CITATION = re.compile(r"\s*\[\d+\]")
_MARKUP = re.compile(r"[*_`#>|]+")
_NUMBER = re.compile(r"\d+(?:[.,]\d+)*")
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+|\n+")


@dataclass(frozen=True, slots=True)
class Support:
    claims: int  # the sentences checked
    supported: int  # those its sources carry

    @property
    def share(self) -> float:
        return self.supported / self.claims if self.claims else 1.0

    def as_dict(self) -> dict[str, float]:
        return {"claims": self.claims, "supported": self.supported, "share": round(self.share, 4)}


def _numbers(text: str) -> set[str]:
    """The numbers of a text, spelt one way ("4,95" and "4.95" alike)."""
    return {n.replace(",", ".").rstrip(".") for n in _NUMBER.findall(text)}


def claims_of(answer: str) -> list[str]:
    """The sentences of an answer that say something: citations and Markdown aside."""
    plain = _MARKUP.sub(" ", _CITATION.sub("", answer))
    parts = (p.strip(" -•\t") for p in _SENTENCE_END.split(plain))
    return [p for p in parts if len(p.split()) >= CLAIM_WORDS]


async def support(
    answer: str,
    cited: Sequence[Passage],
    embedder: Embedder,
    stored: PieceVectors | None = None,
) -> Support:
    """How many of ``answer``'s claims the ``cited`` passages carry: every number of a claim
    is one of theirs, and a sentence of theirs is `CLOSE` in meaning."""
    claims = claims_of(answer)
    if not claims:
        return Support(0, 0)
    if not cited:
        return Support(len(claims), 0)
    sentences = split_sentences([p.text for p in cited])
    known = _numbers(" ".join(p.text for p in cited))
    texts = [piece_text(s) for s in sentences]
    if not texts:
        return Support(len(claims), 0)
    pages = [cited[s.source].page_id for s in sentences]
    rows = await piece_vectors(embedder, texts, pages, stored)
    asked = await embedder.embed(claims)
    closest = np.max(asked @ rows.T, axis=1)
    supported = sum(
        1
        for claim, close in zip(claims, closest, strict=True)
        if close >= CLOSE and _numbers(claim) <= known
    )
    return Support(len(claims), supported)
