"""A page of an agent's content as read from its source, and the chunks it is indexed in."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

Visibility = Literal["public", "internal"]


@dataclass(frozen=True, slots=True)
class Document:
    """One page: its address, its main text and what we know about it.

    ``text`` is the page's main content as light Markdown: headings kept as ``#`` lines so
    the chunker can split on them and record heading paths; navigation, footers and cookie
    banners already removed.
    """

    url: str
    title: str
    text: str
    locale: str | None = None  # "en", "nl", "de-de"; None when unknown
    tags: tuple[str, ...] = ()
    visibility: Visibility = "public"
    page_type: str = "page"  # "page", "policy", "product", "faq", "contact"
    # JSON-LD facts: name, sku, price, currency, availability
    product: Mapping[str, Any] | None = None
    etag: str | None = None
    last_modified: str | None = None
    meta: Mapping[str, Any] = field(default_factory=dict)

    @property
    def content_hash(self) -> bytes:
        """Changes whenever anything that ends up in the index changes."""
        payload = json.dumps(
            [
                self.url,
                self.title,
                self.text,
                self.locale,
                sorted(self.tags),
                self.visibility,
                self.page_type,
                self.product,
            ],
            sort_keys=True,
            ensure_ascii=False,
            default=str,
        )
        return hashlib.sha256(payload.encode()).digest()


@dataclass(frozen=True, slots=True)
class ReadError:
    """A part of a source that could not be read; the rest of the source still is."""

    location: str  # path, "path:line" or URL
    reason: str
    # The page this error is about, when it has one: it stays indexed as it was.
    url: str | None = None


@dataclass(frozen=True, slots=True)
class Chunk:
    ord: int
    heading: str  # "Title > Section > Subsection"
    text: str

    def embedding_input(self) -> str:
        """What the embedder sees: the heading path gives a paragraph its context."""
        return f"{self.heading}\n{self.text}" if self.heading else self.text
