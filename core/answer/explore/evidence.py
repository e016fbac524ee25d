"""The pages an exploring model may cite: those search gave it and those it opened, numbered."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Protocol

from core.store.page_catalog import CatalogPage


class Retrieved(Protocol):
    """A source the pipeline found by search (its numbered `SourceRef`)."""

    @property
    def id(self) -> int: ...
    @property
    def url(self) -> str: ...
    @property
    def title(self) -> str: ...
    @property
    def score(self) -> float: ...
    @property
    def text(self) -> str: ...
    @property
    def locale(self) -> str | None: ...
    @property
    def page_id(self) -> int | None: ...


@dataclass(frozen=True, slots=True)
class EvidencePage:
    """A page the answer may cite as [id]; the fields are those of the pipeline's sources."""

    id: int
    url: str
    title: str
    score: float
    text: str
    locale: str | None = None
    page_id: int | None = None


class Evidence:
    """Search results keep their numbers; a page opened later gets the next one (or its
    number from the search, with its whole text now)."""

    def __init__(self, retrieved: Sequence[Retrieved]) -> None:
        self._pages: dict[int, EvidencePage] = {
            s.id: EvidencePage(s.id, s.url, s.title, s.score, s.text, s.locale, s.page_id)
            for s in retrieved
        }
        self.opened: list[int] = []  # numbers of the pages opened, in order

    def open(self, page: CatalogPage, text: str) -> int:
        """The number the model cites ``page`` by, now that it has read ``text``."""
        known = next((p for p in self._pages.values() if p.page_id == page.id), None)
        if known is not None:
            self._pages[known.id] = replace(known, text=text)
            number = known.id
        else:
            number = max(self._pages, default=0) + 1
            self._pages[number] = EvidencePage(
                number, page.url, page.title, 0.0, text, page.locale, page.id
            )
        if number not in self.opened:
            self.opened.append(number)
        return number

    def __contains__(self, number: object) -> bool:
        return number in self._pages

    def __len__(self) -> int:
        return len(self._pages)

    def pages(self) -> list[EvidencePage]:
        return [self._pages[n] for n in sorted(self._pages)]
