"""How likely an answer is right: a logistic model over what retrieval and the quote show.

The weights are fitted on the labelled questions of `bench/data/answers.jsonl` by
`python -m bench.eval_answers --fit` (which prints them and the reliability table); refit
when the answerer's scoring changes.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from core.answer.extractive import Evidence

# Fitted weights; see the module docstring.
WEIGHTS: Mapping[str, float] = MappingProxyType(
    {
        "bias": -1.737,
        "score": 1.524,
        "similarity": 0.449,
        "coverage": 0.302,
        "names_missing": 0.155,
        "wanted_missing": -0.397,
        "match": 0.341,
        "quote_coverage": 1.040,
        "page_margin": 1.097,
        "faq": -0.053,
        "yes_no": -0.567,
        "other_language": -0.133,
        "unknown": -0.711,
    }
)


@dataclass(frozen=True, slots=True)
class Signals:
    """The inputs of the estimate, as numbers (also what the trace records)."""

    score: float
    similarity: float
    coverage: float
    names_missing: float
    wanted_missing: float
    match: float
    quote_coverage: float
    page_margin: float
    faq: float
    yes_no: float
    other_language: float
    unknown: float

    @classmethod
    def of(cls, evidence: Evidence, match: float, wants_fact: bool, yes_no: bool) -> Signals:
        return cls(
            score=evidence.score,
            similarity=evidence.similarity,
            coverage=evidence.coverage,
            names_missing=evidence.names_missing,
            wanted_missing=float(wants_fact and not evidence.wanted_found),
            match=match,
            quote_coverage=evidence.quote_coverage,
            page_margin=evidence.page_margin,
            faq=float(evidence.faq),
            yes_no=float(yes_no),
            other_language=float(evidence.other_language),
            unknown=evidence.unknown,
        )

    def as_dict(self) -> dict[str, float]:
        return {name: round(getattr(self, name), 4) for name in self.__slots__}


def confidence(signals: Signals, weights: Mapping[str, float] = WEIGHTS) -> float:
    """The estimated probability that the answer is right, in [0, 1]."""
    z = weights["bias"] + sum(
        weights[name] * value for name, value in signals.as_dict().items() if name in weights
    )
    return round(1.0 / (1.0 + math.exp(-max(-30.0, min(30.0, z)))), 4)
