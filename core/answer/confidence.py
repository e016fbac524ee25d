"""How likely an answer is right: a logistic model over what retrieval and the quote show.

The weights are fitted on two corpora at once, so that they hold on content nobody here
wrote: the shop's labelled questions (`bench/data/answers.jsonl`) and the Corona-Warn-App FAQ
(`bench/data/cwa-faq/`), each weighing as much as the other. `python -m bench.fit_confidence`
fits them (after `bench.eval_answers --json` and `bench.eval_faq --json` recorded the signals),
shows how a fit on one corpus does on the other, both ways, and prints the pooled weights
below; refit when the answerer's scoring or its signals change.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType

from core.answer.extractive import Evidence
from core.retrieval.retriever import Hit

# Fitted weights; see the module docstring.
WEIGHTS: Mapping[str, float] = MappingProxyType(
    {
        "bias": -2.822,
        "score": 1.125,
        "similarity": 0.338,
        "coverage": 0.230,
        "names_missing": -0.005,
        "wanted_missing": -0.304,
        "match": 0.203,
        "quote_coverage": 0.713,
        "page_margin": 0.885,
        "faq": -0.280,
        "yes_no": -0.177,
        "other_language": 0.536,
        "unknown": -0.579,
        "entry_similarity": 0.554,
        "entry_lead": 0.519,
        "first": 0.808,
        "dense_top": 0.405,
        "lexical_top": 0.494,
        "dense_lead": 0.558,
    }
)


@dataclass(frozen=True, slots=True)
class Ranking:
    """Where the answering page stands among the pages retrieval ranked: whether it came
    first, whether its meaning is the closest (dense) and its words the best match (lexical)
    of all, and by how much its meaning leads the next page's. Two rankings that agree are
    evidence in any language and whoever wrote the page."""

    first: float = 0.0
    dense_top: float = 0.0
    lexical_top: float = 0.0
    dense_lead: float = 0.0

    @classmethod
    def of(cls, ranked: Sequence[Hit], url: str | None) -> Ranking:
        if url is None or not ranked:
            return cls()
        dense: dict[str, float] = {}
        lexical: dict[str, float] = {}
        for hit in ranked:
            dense[hit.url] = max(dense.get(hit.url, -1.0), hit.dense)
            lexical[hit.url] = max(lexical.get(hit.url, 0.0), hit.lexical)
        own = dense.get(url)
        if own is None:
            return cls()
        others = [v for u, v in dense.items() if u != url]
        best_lexical = max(lexical.values())
        return cls(
            first=float(ranked[0].url == url),
            dense_top=float(own >= max(dense.values())),
            lexical_top=float(best_lexical > 0 and lexical[url] >= best_lexical),
            dense_lead=max(-0.3, min(0.3, own - max(others, default=0.0))),
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
    entry_similarity: float
    entry_lead: float
    first: float
    dense_top: float
    lexical_top: float
    dense_lead: float

    @classmethod
    def of(
        cls,
        evidence: Evidence,
        match: float,
        wants_fact: bool,
        yes_no: bool,
        ranking: Ranking | None = None,
    ) -> Signals:
        ranking = ranking or Ranking()
        # Words are shared within a language: across languages only the encoder's closeness
        # and the rankings tell, and overlap would read as "not answered" (its weight is
        # carried by `other_language` then).
        across = evidence.other_language
        return cls(
            score=evidence.score,
            similarity=evidence.similarity,
            coverage=0.0 if across else evidence.coverage,
            names_missing=evidence.names_missing,
            wanted_missing=float(wants_fact and not evidence.wanted_found),
            match=match,
            quote_coverage=0.0 if across else evidence.quote_coverage,
            page_margin=evidence.page_margin,
            faq=float(evidence.faq),
            yes_no=float(yes_no),
            other_language=float(evidence.other_language),
            unknown=0.0 if across else evidence.unknown,
            entry_similarity=evidence.entry_similarity,
            entry_lead=evidence.entry_lead,
            first=ranking.first,
            dense_top=ranking.dense_top,
            lexical_top=ranking.lexical_top,
            dense_lead=ranking.dense_lead,
        )

    def as_dict(self) -> dict[str, float]:
        return {name: round(getattr(self, name), 4) for name in self.__slots__}


def confidence(signals: Signals, weights: Mapping[str, float] = WEIGHTS) -> float:
    """The estimated probability that the answer is right, in [0, 1]."""
    z = weights["bias"] + sum(
        weights[name] * value for name, value in signals.as_dict().items() if name in weights
    )
    return round(1.0 / (1.0 + math.exp(-max(-30.0, min(30.0, z)))), 4)
