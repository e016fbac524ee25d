"""The figures a benchmark reports to `python -m bench.all`, beside the table it prints.

A benchmark calls :func:`record` for each figure that counts; when it runs under
`bench.all` (``PARLEY_BENCH_FIGURES`` names a file) every call appends one JSON line there,
and otherwise does nothing, so a benchmark run by hand prints just as before.
"""

from __future__ import annotations

import json
import os
from typing import Literal

ENVIRONMENT = "PARLEY_BENCH_FIGURES"

Comparison = Literal["<", "<=", ">", ">="]


def record(
    name: str,
    value: float,
    unit: str,
    *,
    floor: float | None = None,
    aim: tuple[Comparison, float] | None = None,
    ratio_aim: tuple[Comparison, float] | None = None,
) -> None:
    """One figure: ``floor`` is the in-run baseline it is compared with (value / floor is
    printed as the ratio); ``aim`` is judged on the value, ``ratio_aim`` on the ratio."""
    path = os.environ.get(ENVIRONMENT)
    if not path:
        return
    line = {
        "name": name,
        "value": float(value),
        "unit": unit,
        "floor": None if floor is None else float(floor),
        "aim": list(aim) if aim else None,
        "ratio_aim": list(ratio_aim) if ratio_aim else None,
    }
    with open(path, "a", encoding="utf-8") as out:
        out.write(json.dumps(line) + "\n")


def met(value: float, aim: tuple[str, float] | list[object]) -> bool:
    """Whether ``value`` meets an aim such as ``("<", 20.0)``."""
    comparison, limit = str(aim[0]), float(aim[1])  # type: ignore[arg-type]
    return {
        "<": value < limit,
        "<=": value <= limit,
        ">": value > limit,
        ">=": value >= limit,
    }[comparison]
