"""The quotable pieces of a page: its sentences, list items and table rows, each with its
heading, and the texts the encoder compares with a question.

The extractive answerer quotes these pieces; ingest encodes them ahead of time so that a turn
only has to encode its question. Both cut a text the same way, by the code of this module, so
a stored vector is the one a turn would compute for the same text (looked up by `digest`).
"""

from __future__ import annotations

import functools
import hashlib
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace

_HEADING = re.compile(r"^\s{0,3}(#{1,6})\s+(?P<text>.+)$")
_LIST_ITEM = re.compile(r"^\s*(?:[-*+•]|\d{1,3}[.)])\s+(?P<item>.+)$")
_TABLE_ROW = re.compile(r"^\s*\|(?P<cells>.*)\|\s*$")
_TABLE_RULE = re.compile(r"^[\s|:\-]+$")
_SENTENCE_END = re.compile(r"(?<=[.!?…])\s+(?=[\"'(\[«„]?[A-ZÀ-ÖØ-Þ0-9])")
_ABBREVIATION = re.compile(
    r"(?:\b(?:e\.g|i\.e|etc|approx|incl|excl|vs|no|nr|ca|max|min|tel|bijv|bv|o\.a|d\.w\.z|"
    r"m\.b\.t|z\.B|u\.a|usw|bzw|ggf|evtl|inkl|p\.ex|env|cf|dr|mr|mrs|ms|st)|\b[A-Z])\.$",
    re.IGNORECASE,
)
LABELLED = re.compile(r"^[^:\d]{2,40}:\s+\S")  # "Price: €169.95", a fact with its label
_MIN_WORDS = 3


@dataclass(frozen=True, slots=True)
class Sentence:
    """A quotable piece of a source."""

    source: int  # 0-based index into the sources
    text: str
    heading: str = ""
    block: int = -1  # the list or table it belongs to (-1: a paragraph sentence)
    header: tuple[str, ...] = ()  # a table row's column names
    paragraph: int = -1  # the paragraph a sentence belongs to, counted per source
    cells: tuple[str, ...] = ()  # a table row's cells


def _split_paragraph(paragraph: str) -> Iterator[str]:
    pending = ""
    for piece in _SENTENCE_END.split(paragraph):
        pending = f"{pending} {piece}" if pending else piece
        if not _ABBREVIATION.search(pending):
            yield pending
            pending = ""
    if pending:
        yield pending


def _table_sentence(cells: Sequence[str], header: Sequence[str] | None) -> str:
    """A table row as a sentence: "Country: Belgium; Delivery: 2-3 days" when headed."""
    if header and len(header) == len(cells):
        return "; ".join(f"{h}: {c}" if h else c for h, c in zip(header, cells, strict=True) if c)
    return ", ".join(c for c in cells if c)


@dataclass
class _Reader:
    """Walks one source's lines, keeping track of the heading and the current block."""

    source: int
    next_block: int
    heading: str = ""
    block: int = -1
    header: list[str] | None = None
    paragraph: list[str] = field(default_factory=list)
    paragraphs: int = 0

    def flush(self) -> Iterator[Sentence]:
        if self.paragraph:
            self.paragraphs += 1
            for text in _split_paragraph(" ".join(self.paragraph)):
                yield Sentence(self.source, text, self.heading, paragraph=self.paragraphs)
            self.paragraph.clear()

    def open_block(self) -> int:
        if self.block < 0:
            self.block = self.next_block
            self.next_block += 1
        return self.block

    def close_block(self) -> None:
        self.block, self.header = -1, None

    def read(self, text: str) -> Iterator[Sentence]:
        for line in text.splitlines():
            row = _TABLE_ROW.match(line)
            item = _LIST_ITEM.match(line) if row is None else None
            heading = _HEADING.match(line)
            if row is None and item is None:
                yield from self.flush()
                if line.strip():
                    self.close_block()
            if heading is not None:
                self.heading = heading["text"].strip()
            elif row is not None:
                yield from self.flush()
                if _TABLE_RULE.match(line):
                    continue
                cells = [cell.strip() for cell in row["cells"].split("|")]
                if self.header is None:
                    self.open_block()
                    self.header = cells  # the first row names the columns
                    continue
                yield Sentence(
                    self.source,
                    _table_sentence(cells, self.header),
                    self.heading,
                    self.block,
                    tuple(self.header),
                    cells=tuple(cells),
                )
            elif item is not None:
                yield from self.flush()
                if self.header is not None:
                    self.close_block()
                yield Sentence(self.source, item["item"].strip(), self.heading, self.open_block())
            elif line.strip():
                self.paragraph.append(line.strip())
        yield from self.flush()


def _quotable(text: str) -> bool:
    return len(text.split()) >= _MIN_WORDS or bool(LABELLED.match(text))


def split_sentences(sources: Sequence[str]) -> list[Sentence]:
    """The pieces worth quoting, in source order, each once."""
    seen: set[str] = set()
    sentences = []
    blocks = 0
    for index, text in enumerate(sources):
        candidates, count = _candidates(text)
        for sentence, key in candidates:
            if key in seen:
                continue
            seen.add(key)
            if index or blocks:
                sentence = Sentence(
                    index,
                    sentence.text,
                    sentence.heading,
                    sentence.block + blocks if sentence.block >= 0 else -1,
                    sentence.header,
                    sentence.paragraph,
                    sentence.cells,
                )
            sentences.append(sentence)
        blocks += count
    return [s for s in _lines_joined(sentences) if s.block >= 0 or _quotable(s.text)]


@functools.lru_cache(maxsize=4096)
def _candidates(text: str) -> tuple[tuple[tuple[Sentence, str], ...], int]:
    """One source's pieces that may be quoted (as the first source), each with the key that
    tells a repeat, and how many lists and tables it has: the same pages are read turn after
    turn, in other company."""
    reader = _Reader(0, 0)
    out = []
    for sentence in reader.read(text):
        short = sentence.paragraph >= 0 and len(sentence.text.split()) <= 5
        if sentence.block >= 0 or short or _quotable(sentence.text):
            out.append((sentence, " ".join(sentence.text.casefold().split())))
    return tuple(out), reader.next_block


def _lines_joined(sentences: list[Sentence]) -> list[Sentence]:
    """Runs of short one-line paragraphs under one heading (an address: "Westblaak 142",
    "3012 KM Rotterdam") become one piece, so a quote holds all of them."""
    out: list[Sentence] = []
    for sentence in sentences:
        last = out[-1] if out else None
        if (
            last is not None
            and _short_line(sentence)
            and _short_line(last, joined=True)
            and last.source == sentence.source
            and last.heading == sentence.heading
            and sentence.paragraph == last.paragraph + 1
        ):
            out[-1] = replace(
                last, text=f"{last.text}, {sentence.text}", paragraph=sentence.paragraph
            )
        else:
            out.append(sentence)
    return out


def _short_line(sentence: Sentence, *, joined: bool = False) -> bool:
    limit = 24 if joined else 5
    return sentence.block < 0 and sentence.paragraph >= 0 and len(sentence.text.split()) <= limit


def piece_text(sentence: Sentence) -> str:
    """What the encoder sees of a piece: its heading gives a short sentence its meaning."""
    return f"{sentence.heading}: {sentence.text}" if sentence.heading else sentence.text


def page_text(parts: Sequence[tuple[str, str]]) -> str:
    """A page's whole text from its chunks, as (heading path, text) in page order: each
    section's last heading as a Markdown line before its first chunk."""
    lines: list[str] = []
    last = None
    for heading, text in parts:
        if heading and heading != last:
            lines.append(f"## {heading.split(' > ')[-1]}")
            last = heading
        lines.append(text)
    return "\n\n".join(lines)


def page_piece_texts(parts: Sequence[tuple[str, str]]) -> list[str]:
    """The texts of a page's pieces whose vectors a turn may need, each once: those of the
    page as a whole (how the best pages are read) and those of each chunk on its own (how a
    page is read from the few chunks that matched, without their headings), and the page's
    own questions (`entry_texts`). A passage made of several chunks has the pieces of each,
    but for rows and lines joined across two chunks: those a turn encodes itself."""
    texts = [piece_text(s) for s in split_sentences([page_text(parts)])]
    for _, text in parts:
        texts.extend(piece_text(s) for s in split_sentences([text]))
    texts.extend(entry_texts(parts))
    return list(dict.fromkeys(texts))


def entry_texts(parts: Sequence[tuple[str, str]]) -> list[str]:
    """What the answerer compares a visitor's question with to find the entry that asks it:
    the page's title (the first part of every heading path) and each heading that asks a
    question (an FAQ's), as ``page_text`` writes them."""
    found: list[str] = []
    for heading, _ in parts:
        names = [name.strip() for name in heading.split(" > ") if name.strip()]
        if names:
            found.append(names[0])
            if names[-1].endswith("?"):
                found.append(names[-1])
    return list(dict.fromkeys(found))


def digest(text: str) -> bytes:
    """The key a piece's vector is stored under."""
    return hashlib.blake2b(text.encode(), digest_size=16).digest()
