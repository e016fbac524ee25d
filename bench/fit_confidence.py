"""Fit the confidence weights (`core/answer/confidence.py`) so that they transfer: fitted on one
corpus, tested on the other, both ways; the pooled fit is what ships.

    .venv/bin/python -m bench.eval_answers --json /tmp/shop.jsonl
    .venv/bin/python -m bench.eval_faq --json /tmp/faq.jsonl
    .venv/bin/python -m bench.fit_confidence /tmp/shop.jsonl /tmp/faq.jsonl

Each file holds one corpus's attempts (answer threshold 0) with the signals their turns
recorded. Printed: for each direction (shop -> FAQ, FAQ -> shop) and for the pooled fit, the
AUC and the area under the risk-coverage curve on the corpus it was not fitted on (pooled:
5-fold cross-validated), the weights, and, on the pooled attempts, right / confidently wrong /
deferred at a range of thresholds. In the pooled fit each corpus weighs as much as the other,
whatever its number of questions.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import numpy as np

from bench.answer_figures import (
    Attempt,
    auc_of,
    aurc,
    design,
    logistic,
    outcome_shares,
    predict,
    rescored,
    train,
)
from core.answer.confidence import WEIGHTS, Signals

NAMES = list(Signals.__slots__)
THRESHOLDS = (0.4, 0.5, 0.55, 0.6, 0.65, 0.7, 0.75, 0.8)


def load(path: str) -> list[Attempt]:
    rows = [json.loads(line) for line in Path(path).read_text("utf-8").splitlines() if line]
    return [Attempt(**row) for row in rows]


def _answered(attempts: Sequence[Attempt]) -> list[Attempt]:
    return [a for a in attempts if a.answered]


def fitted(attempts: Sequence[Attempt]) -> np.ndarray:
    """Weights fitted on the answers among ``attempts``, each corpus weighing the same."""
    rows = _answered(attempts)
    corpora = {a.corpus for a in rows}
    share = {c: sum(a.corpus == c for a in rows) / len(rows) for c in corpora}
    sample = np.array([1.0 / share[a.corpus] for a in rows])
    y = np.array([a.right for a in rows], dtype=np.float64)
    return train(design(rows, NAMES), y, sample=sample)


def _figures(name: str, attempts: Sequence[Attempt]) -> str:
    return f"{name:<34} AUC {auc_of(attempts):.3f}   risk-coverage area {aurc(attempts):.3f}"


def main(args: argparse.Namespace) -> None:
    shop, faq = load(args.shop), load(args.faq)
    shipped = logistic([WEIGHTS["bias"], *(WEIGHTS.get(n, 0.0) for n in NAMES)], NAMES)
    print(_figures("shop, weights as shipped", rescored(shop, shipped)))
    print(_figures("FAQ, weights as shipped", rescored(faq, shipped)))
    for train_on, test_on, label in ((shop, faq, "shop -> FAQ"), (faq, shop, "FAQ -> shop")):
        w = fitted(train_on)
        print(_figures(f"{label} (tested on the other)", rescored(test_on, logistic(w, NAMES))))
    pooled = [*shop, *faq]
    folds = np.arange(len(pooled)) % 5
    held: dict[int, float] = {}
    for k in range(5):
        w = fitted([a for a, f in zip(pooled, folds, strict=True) if f != k])
        test = [i for i, f in enumerate(folds) if f == k]
        scores = predict(w, design([pooled[i] for i in test], NAMES))
        held.update(zip(test, scores, strict=True))
    cross = [replace(a, confidence=float(held[i])) for i, a in enumerate(pooled)]
    for corpus in ("shop", "faq"):
        rows = [a for a in cross if a.corpus == corpus]
        print(_figures(f"pooled, 5-fold, on {corpus}", rows))
    w = fitted(pooled)
    print("\npooled weights (paste into core/answer/confidence.py):")
    print(
        "    " + ",\n    ".join(f'"{n}": {v:.3f}' for n, v in zip(["bias", *NAMES], w, strict=True))
    )
    final = rescored(pooled, logistic(w, NAMES))
    print("\nright / confidently wrong / deferred by threshold (pooled fit):")
    print(f"{'threshold':<10}" + "".join(f"{c:>22}" for c in ("shop", "faq", "faq answerable")))
    for threshold in THRESHOLDS:
        cells = []
        for rows in (
            [a for a in final if a.corpus == "shop"],
            [a for a in final if a.corpus == "faq"],
            [a for a in final if a.corpus == "faq" and a.answerable],
        ):
            right, wrong, deferred = outcome_shares(rows, threshold)
            cells.append(f"{right:.2f} {wrong:.2f} {deferred:.2f}")
        print(f"{threshold:<10}" + "".join(f"{c:>22}" for c in cells))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("shop", help="attempts of bench.eval_answers --json")
    parser.add_argument("faq", help="attempts of bench.eval_faq --json")
    main(parser.parse_args())
