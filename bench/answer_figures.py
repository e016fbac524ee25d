"""Figures of answer quality shared by the evaluations: right, confidently wrong and deferred
per language and kind, the risk-coverage curve, how well confidence ranks the attempts, and the
logistic fit of the confidence weights.

An attempt is what the answerer says with the answer threshold at 0: an answer (with its
confidence) or, when it found nothing to quote, its deferral. As deployed, an answer below the
threshold is replaced by the deferral. A deployed reply is then

- right: an answerable question answered right (the fact, or the answering entry cited);
- wrong (confidently wrong): answered, but not right (every answer to an unanswerable
  question is wrong);
- deferred: the deferral; right for an unanswerable question.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
from numpy.typing import NDArray

BINS = (0.0, 0.2, 0.4, 0.6, 0.8, 1.0001)


@dataclass(frozen=True)
class Attempt:
    qid: str
    lang: str
    kind: str
    answerable: bool
    answered: bool  # an answer, not the answerer's own deferral (threshold 0)
    right: bool  # answerable, answered, and right
    confidence: float
    signals: Mapping[str, float] = field(default_factory=dict)
    answer: str = ""
    corpus: str = ""  # which set it comes from ("shop", "faq")
    detail: str = ""  # what a reader of a wrong attempt needs: the question, what was wanted

    def deployed(self, threshold: float) -> str:
        """ "right", "wrong" or "deferred", as the pipeline would reply at ``threshold``."""
        if not self.answered or self.confidence < threshold:
            return "right" if not self.answerable else "deferred"
        return "right" if self.right else "wrong"


def _share(values: Sequence[bool]) -> float:
    return sum(values) / len(values) if values else float("nan")


def outcome_shares(attempts: Sequence[Attempt], threshold: float) -> tuple[float, float, float]:
    """Shares of right, confidently wrong and deferred replies."""
    verdicts = [a.deployed(threshold) for a in attempts]
    deferred = [not a.answered or a.confidence < threshold for a in attempts]
    return (
        _share([v == "right" for v in verdicts]),
        _share([v == "wrong" for v in verdicts]),
        _share(deferred),
    )


def print_outcomes(attempts: Sequence[Attempt], threshold: float, title: str) -> None:
    """One row per kind, one column per language: right / confidently wrong / deferred."""
    print(f"{title} (threshold {threshold:.2f}): right / confidently wrong / deferred (n)\n")
    languages = sorted({a.lang for a in attempts})
    kinds = sorted({a.kind for a in attempts})
    width = 22
    print(f"{'kind':<14}" + "".join(f"{lang:>{width}}" for lang in [*languages, "all"]))
    for kind in [*kinds, "all"]:
        cells = []
        for lang in [*languages, "all"]:
            rows = [a for a in attempts if kind in ("all", a.kind) and lang in ("all", a.lang)]
            if not rows:
                cells.append(f"{'-':>{width}}")
                continue
            right, wrong, deferred = outcome_shares(rows, threshold)
            cells.append(f"{right:.2f} {wrong:.2f} {deferred:.2f} ({len(rows):>3})".rjust(width))
        print(f"{kind:<14}" + "".join(cells))
    print(f"\narea under the risk-coverage curve {aurc(attempts):.3f} (lower is better; "
          f"AUC of confidence {auc_of(attempts):.3f})")  # fmt: skip


def aurc(attempts: Sequence[Attempt]) -> float:
    """Area under the risk-coverage curve: answers taken best-confidence first, the share of
    them wrong (risk) against the share of all questions answered (coverage), averaged over
    coverage. Questions the answerer defers at any threshold count as never covered."""
    answered = sorted((a for a in attempts if a.answered), key=lambda a: -a.confidence)
    if not attempts:
        return float("nan")
    wrong = 0
    area = 0.0
    for k, attempt in enumerate(answered, start=1):
        wrong += not attempt.right
        area += wrong / k
    return area / len(attempts)


def auc(scores: Sequence[float], labels: Sequence[bool]) -> float:
    """Probability that a random right attempt scores above a random wrong one."""
    right = np.array([s for s, y in zip(scores, labels, strict=True) if y])
    wrong = np.array([s for s, y in zip(scores, labels, strict=True) if not y])
    if not len(right) or not len(wrong):
        return float("nan")
    wins = (right[:, None] > wrong[None, :]).sum() + 0.5 * (right[:, None] == wrong[None, :]).sum()
    return float(wins) / (len(right) * len(wrong))


def auc_of(attempts: Sequence[Attempt]) -> float:
    """How well confidence ranks the answers: right ones above wrong ones."""
    answered = [a for a in attempts if a.answered]
    return auc([a.confidence for a in answered], [a.right for a in answered])


def print_calibration(attempts: Sequence[Attempt]) -> None:
    answered = [a for a in attempts if a.answered]
    print("\nConfidence of answers (threshold 0) against being right:\n")
    print(f"{'confidence':<12}{'n':>5}{'mean conf':>11}{'share right':>13}")
    for low, high in itertools.pairwise(BINS):
        rows = [a for a in answered if low <= a.confidence < high]
        if not rows:
            print(f"{low:.1f}-{min(high, 1.0):.1f}{'':>5}{0:>5}")
            continue
        mean = sum(a.confidence for a in rows) / len(rows)
        right = sum(a.right for a in rows) / len(rows)
        print(f"{low:.1f}-{min(high, 1.0):.1f}{'':>5}{len(rows):>5}{mean:>11.2f}{right:>13.2f}")
    if answered:
        brier = sum((a.confidence - a.right) ** 2 for a in answered) / len(answered)
        print(f"\nAUC {auc_of(answered):.3f}   Brier {brier:.3f}   n={len(answered)}")


def print_wrong(attempts: Iterable[Attempt], threshold: float) -> None:
    print(f"\nWrong replies at threshold {threshold:.2f}:")
    for a in attempts:
        if a.deployed(threshold) != "wrong":
            continue
        print(f"\n[{a.corpus} {a.qid} {a.kind} {a.lang}] conf={a.confidence:.2f}\n{a.detail}")
        print(f"    got:  {a.answer[:400]}")


# -- fitting the confidence weights -------------------------------------------------------


def design(attempts: Sequence[Attempt], names: Sequence[str]) -> NDArray[np.float64]:
    return np.array([[a.signals.get(n, 0.0) for n in names] for a in attempts], dtype=np.float64)


def train(
    x: NDArray[np.float64],
    y: NDArray[np.float64],
    *,
    l2: float = 0.01,
    sample: NDArray[np.float64] | None = None,
) -> NDArray[np.float64]:
    """Logistic regression by gradient descent: the bias first, then one weight per column.
    ``sample``: a weight per row (each corpus counts as much as the other in a pooled fit)."""
    weights = np.ones(len(y)) if sample is None else sample
    weights = weights / weights.mean()
    full = np.hstack([np.ones((len(x), 1)), x])
    w = np.zeros(full.shape[1])
    for _ in range(8000):
        p = 1 / (1 + np.exp(-np.clip(full @ w, -30, 30)))
        grad = full.T @ ((p - y) * weights) / len(y) + l2 * np.r_[0, w[1:]]
        w -= 0.5 * grad
    return w


def predict(w: NDArray[np.float64], x: NDArray[np.float64]) -> NDArray[np.float64]:
    return np.asarray(1 / (1 + np.exp(-np.clip(w[0] + x @ w[1:], -30, 30))))


def rescored(attempts: Sequence[Attempt], score: Callable[[Attempt], float]) -> list[Attempt]:
    """The attempts with their confidence given by ``score`` (a refitted model)."""
    from dataclasses import replace

    return [replace(a, confidence=round(score(a), 4)) for a in attempts]


def logistic(w: Sequence[float], names: Sequence[str]) -> Callable[[Attempt], float]:
    def score(a: Attempt) -> float:
        z = w[0] + sum(w[i + 1] * a.signals.get(n, 0.0) for i, n in enumerate(names))
        return 1 / (1 + math.exp(-max(-30.0, min(30.0, z))))

    return score
