"""The sources a messaging reply cites, listed as links after the answer, within the limit."""

from __future__ import annotations

import html
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol
from urllib.parse import quote, urljoin, urlsplit

from channels.delivery import split_message

__all__ = [
    "SOURCES_HEADING",
    "CitedSource",
    "ReplyParts",
    "link_url",
    "reply_parts",
    "source_lines",
    "sources_heading",
    "telegram_html",
]

# The list's heading in the reply's language; the widget says the same.
SOURCES_HEADING = {
    "en": "Sources",
    "nl": "Bronnen",
    "de": "Quellen",
    "fr": "Sources",
    "es": "Fuentes",
    "it": "Fonti",
    "pt": "Fontes",
    "da": "Kilder",
    "nb": "Kilder",
    "no": "Kilder",
    "sv": "Källor",
    "fi": "Lähteet",
    "pl": "Źródła",
    "cs": "Zdroje",
    "tr": "Kaynaklar",
}
TITLE_CHARS = 60  # a page title is a label here, not a headline
SEPARATOR = " – "
# Characters a URL may keep as they are; the rest (spaces, quotes, <, >, non-ASCII) are
# percent-encoded, so a URL is one token that messaging apps turn into a link whole.
_URL_SAFE = "!#$%&'()*+,-./:;=?@[]_~"

_HEADINGS = frozenset(f"{word}:" for word in SOURCES_HEADING.values())
_LINE = re.compile(
    r"\[(?P<n>\d+)\] (?P<label>.+?)(?:" + re.escape(SEPARATOR) + r"(?P<url>https?://\S+))?"
)
_URL_ONLY = re.compile(r"https?://\S+")


class CitedSource(Protocol):
    """A source the answer cites, numbered as the answer cites it (`SourceRef` is one)."""

    @property
    def id(self) -> int: ...

    @property
    def url(self) -> str: ...

    @property
    def title(self) -> str: ...


def sources_heading(language: str | None) -> str:
    """ "Sources" in ``language`` (``nl``, ``de-CH``, ...); English for one we do not know."""
    code = (language or "en").replace("_", "-").split("-")[0].lower()
    return SOURCES_HEADING.get(code, SOURCES_HEADING["en"])


def link_url(url: str, site: str | None) -> str | None:
    """An absolute http(s) URL for a source's ``url``, or None when it cannot be one.

    Pages ingested without a base URL are stored root-relative (``/en/shipping.html``);
    they live on the agent's ``site`` (``https://shop.example``), and without one they
    cannot be linked to from a messaging app.
    """
    url = url.strip()
    if not url:
        return None
    if not urlsplit(url).scheme:
        if not site:
            return None
        url = urljoin(site.rstrip("/") + "/", url)
    parts = urlsplit(url)
    if parts.scheme.lower() not in ("http", "https") or not parts.netloc:
        return None
    return quote(url, safe=_URL_SAFE)


def _short(title: str) -> str:
    words = " ".join(title.split())
    if len(words) <= TITLE_CHARS:
        return words
    cut = words[: TITLE_CHARS - 1]
    if " " in cut:
        cut = cut.rsplit(" ", 1)[0]
    return cut.rstrip(" ,;:-–") + "…"


def source_lines(sources: Sequence[CitedSource], site: str | None) -> list[tuple[str, str]]:
    """One line per source, by number: ``[1] Shipping – https://...``, and the same line
    without its URL (for a URL too long for any message). Sources with neither a title nor
    a URL that can be linked are left out."""
    lines = []
    for source in sorted(sources, key=lambda s: s.id):
        title = _short(source.title)
        url = link_url(source.url, site)
        number = f"[{source.id}]"
        if title and url:
            lines.append((f"{number} {title}{SEPARATOR}{url}", f"{number} {title}"))
        elif title or url:
            line = f"{number} {title or url}"
            lines.append((line, line))
    return lines


def _blocks(heading: str, lines: Sequence[tuple[str, str]], limit: int) -> list[str]:
    """The list as few messages of at most ``limit`` characters as it takes, each under the
    heading; a line (a link) is never cut."""
    blocks: list[str] = []
    current = heading
    for full, short in lines:
        line = full if len(heading) + 1 + len(full) <= limit else short
        if len(heading) + 1 + len(line) > limit:
            continue  # no message could hold it
        if len(current) + 1 + len(line) > limit:
            blocks.append(current)
            current = heading
        current += "\n" + line
    if current != heading:
        blocks.append(current)
    return blocks


def reply_parts(
    text: str,
    limit: int,
    sources: Sequence[CitedSource] = (),
    *,
    language: str | None = None,
    site: str | None = None,
) -> list[str]:
    """``text`` split into messages of at most ``limit`` characters, then its sources.

    The list ("Sources:" in ``language``, one numbered line per source) goes after a blank
    line at the end of the last message when it fits there whole, else in a message of its
    own. Root-relative URLs are completed with ``site``.
    """
    parts = split_message(text, limit)
    lines = source_lines(sources, site)
    if not lines:
        return parts
    blocks = _blocks(f"{sources_heading(language)}:", lines, limit)
    if parts and blocks and len(parts[-1]) + 2 + len(blocks[0]) <= limit:
        parts[-1] += "\n\n" + blocks.pop(0)
    return parts + blocks


@dataclass(frozen=True, slots=True)
class ReplyParts:
    """`reply_parts` at one channel's message limit: what the gateway hands the inbox worker
    (and staff replies) for WhatsApp and Telegram."""

    limit: int

    def __call__(
        self,
        text: str,
        sources: Sequence[CitedSource] = (),
        *,
        language: str | None = None,
        site: str | None = None,
    ) -> list[str]:
        return reply_parts(text, self.limit, sources, language=language, site=site)


def _escape(text: str) -> str:
    return html.escape(text, quote=False)


def _link_line(line: str) -> str:
    match = _LINE.fullmatch(line)
    if match is None:
        return _escape(line)
    label, url = match["label"], match["url"]
    if url is None and _URL_ONLY.fullmatch(label):
        url = label  # a source without a title is listed by its URL
    if url is None:
        return _escape(line)
    return f'[{match["n"]}] <a href="{html.escape(url, quote=True)}">{_escape(label)}</a>'


def telegram_html(part: str) -> str:
    """A message for Telegram's HTML parse mode: all text escaped, and a source list at its
    end (as `reply_parts` writes it) with each source's title as a link."""
    head, gap, tail = part.rpartition("\n\n")
    lines = tail.split("\n")
    if (
        len(lines) < 2
        or lines[0] not in _HEADINGS
        or not all(_LINE.fullmatch(line) for line in lines[1:])
    ):
        return _escape(part)
    listed = "\n".join([_escape(lines[0]), *(_link_line(line) for line in lines[1:])])
    return _escape(head) + gap + listed
