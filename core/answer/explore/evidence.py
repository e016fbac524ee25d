"""The pages an exploring model may cite: those search gave it and those it opened, numbered."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from core.answer.sources import SourceRef
from core.store.page_catalog import CatalogPage


class Evidence:
    """Search results keep their numbers; a page opened later gets the next one (or its
    number from the search, with its whole text now)."""

    def __init__(self, retrieved: Sequence[SourceRef]) -> None:
        self._pages: dict[int, SourceRef] = {s.id: s for s in retrieved}
        self.opened: list[int] = []  # numbers of the pages opened, in order

    def open(self, page: CatalogPage, text: str) -> int:
        """The number the model cites ``page`` by, now that it has read ``text``."""
        known = next((p for p in self._pages.values() if p.page_id == page.id), None)
        if known is not None:
            self._pages[known.id] = replace(known, text=text)
            number = known.id
        else:
            number = max(self._pages, default=0) + 1
            self._pages[number] = SourceRef(
                number, page.url, page.title, 0.0, text, page.locale, page.id
            )
        if number not in self.opened:
            self.opened.append(number)
        return number

    def __contains__(self, number: object) -> bool:
        return number in self._pages

    def __len__(self) -> int:
        return len(self._pages)

    def pages(self) -> list[SourceRef]:
        return [self._pages[n] for n in sorted(self._pages)]
