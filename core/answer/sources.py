"""The pages an answer is written from, numbered as the prompt and the answer cite them."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from core.answer.postprocess import postprocess


@dataclass(frozen=True, slots=True)
class SourceRef:
    id: int
    url: str
    title: str
    score: float
    text: str
    locale: str | None = None
    page_id: int | None = None

    def public(self) -> dict[str, Any]:
        return {"id": self.id, "url": self.url, "title": self.title, "score": self.score}


def cited_first(text: str, sources: list[SourceRef]) -> tuple[str, list[SourceRef]]:
    """The text with its citations numbered in order of first use, and the sources in that
    order (those it does not cite after them)."""
    processed = postprocess(text, len(sources), [s.text for s in sources])
    order = [*processed.source_numbers]
    order += [s.id for s in sources if s.id not in order]
    by_number = {s.id: s for s in sources}
    return processed.text, [replace(by_number[n], id=i) for i, n in enumerate(order, start=1)]
