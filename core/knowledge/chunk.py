"""Splits a page's text into chunks on headings and paragraphs, each with its heading path."""

from __future__ import annotations

import re
from collections.abc import Sequence

import numpy as np
from numpy.typing import NDArray

from core.documents import Chunk, Document
from core.ports import Embedder

_HEADING = re.compile(r"^(#{1,6})\s+(.+?)\s*#*\s*$")
_SENTENCE_END = re.compile(r"(?<=[.!?…])\s+(?=[\"'(\[]?[A-ZÀ-ÖØ-Þ0-9])")

# Sizes in words (a word is about 1.3 tokens for the languages we serve).
TARGET_WORDS = 180
MAX_WORDS = 260
OVERLAP_WORDS = 30
# The weight of a chunk's heading path beside its text in the vector it is found by. With
# the bundled encoder, reworded questions on the Corona-Warn-App FAQ found their entry first
# 0.61 of the time at 0.5 (0.62 at 1.0, 0.39 without), while on the shop (bench/data) 1.0
# lost hit@1 (0.81 to 0.78) and 0.5 kept it (0.80, MRR 0.87 either way).
HEADING_WEIGHT = 0.5


def _words(text: str) -> int:
    return len(text.split())


def _sections(doc: Document) -> list[tuple[str, list[str]]]:
    """(heading path, paragraphs) per section, in order."""
    path: list[tuple[int, str]] = []
    sections: list[tuple[str, list[str]]] = []
    paragraphs: list[str] = []
    current: list[str] = []

    def heading_path() -> str:
        names = [name for _, name in path]
        if doc.title and (not names or names[0].casefold() != doc.title.casefold()):
            names.insert(0, doc.title)
        return " > ".join(names)

    def flush_paragraph() -> None:
        if current:
            paragraphs.append(" ".join(line.strip() for line in current).strip())
            current.clear()

    def flush_section() -> None:
        flush_paragraph()
        kept = [p for p in paragraphs if p]
        if kept:
            sections.append((heading_path(), kept))
        paragraphs.clear()

    for line in doc.text.splitlines():
        match = _HEADING.match(line.strip())
        if match:
            flush_section()
            level = len(match.group(1))
            path[:] = [(lvl, name) for lvl, name in path if lvl < level]
            path.append((level, match.group(2).strip()))
        elif not line.strip():
            flush_paragraph()
        elif line.lstrip().startswith(("- ", "* ", "|")) or re.match(r"^\s*\d+[.)]\s", line):
            # List items and table rows stay on their own lines inside one paragraph.
            flush_paragraph()
            paragraphs.append(line.strip())
        else:
            current.append(line)
    flush_section()
    return sections


def _sentences(paragraph: str) -> list[str]:
    return [s for s in _SENTENCE_END.split(paragraph) if s.strip()]


def _split_long(paragraph: str) -> list[str]:
    """A paragraph over the limit, cut between sentences (or words, for run-on text)."""
    pieces: list[str] = []
    current: list[str] = []
    for sentence in _sentences(paragraph):
        words = sentence.split()
        while len(words) > MAX_WORDS:  # one enormous sentence
            pieces.append(" ".join(words[:MAX_WORDS]))
            words = words[MAX_WORDS:]
        sentence = " ".join(words)
        if current and _words(" ".join(current)) + len(words) > TARGET_WORDS:
            pieces.append(" ".join(current))
            current = []
        current.append(sentence)
    if current:
        pieces.append(" ".join(current))
    return pieces


def _tail(text: str, words: int) -> str:
    """The last sentences of a chunk, up to ``words`` words, carried into the next one."""
    kept: list[str] = []
    for sentence in reversed(_sentences(text)):
        if _words(" ".join([sentence, *kept])) > words:
            break
        kept.insert(0, sentence)
    return " ".join(kept)


def chunk_document(doc: Document) -> list[Chunk]:
    """Chunks of a few hundred tokens that never cross a heading; neighbours overlap a little."""
    chunks: list[Chunk] = []
    for heading, paragraphs in _sections(doc):
        units: list[str] = []
        for paragraph in paragraphs:
            units.extend(_split_long(paragraph) if _words(paragraph) > MAX_WORDS else [paragraph])
        buffer: list[str] = []
        for unit in units:
            if buffer and _words("\n".join(buffer)) + _words(unit) > TARGET_WORDS:
                text = "\n".join(buffer)
                chunks.append(Chunk(len(chunks), heading, text))
                overlap = _tail(text, OVERLAP_WORDS)
                buffer = [overlap] if overlap and overlap != text else []
            buffer.append(unit)
        if buffer:
            chunks.append(Chunk(len(chunks), heading, "\n".join(buffer)))
    if not chunks and doc.title.strip():
        chunks.append(Chunk(0, doc.title.strip(), doc.title.strip()))
    return chunks


async def embed_chunks(
    embedder: Embedder, chunks: Sequence[Chunk], also: Sequence[str] = ()
) -> tuple[NDArray[np.float32], NDArray[np.float32]]:
    """The vectors chunks are found by, and those of the texts ``also`` (one call for both).

    A chunk's vector is the normalised sum of its text's (with its heading path) and, at
    `HEADING_WEIGHT`, its heading path's alone. Visitors ask what a heading says in other
    words (an FAQ entry's question, a section's title), and in the vector of a long text the
    heading's few words count for little."""
    inputs = [chunk.embedding_input() for chunk in chunks]
    headings = list(dict.fromkeys(chunk.heading for chunk in chunks if chunk.heading))
    vectors = await embedder.embed([*inputs, *headings, *also])
    found = vectors[: len(inputs)].astype(np.float32, copy=True)
    of_heading = dict(
        zip(headings, vectors[len(inputs) : len(inputs) + len(headings)], strict=True)
    )
    for row, chunk in enumerate(chunks):
        if chunk.heading:
            both = found[row] + HEADING_WEIGHT * of_heading[chunk.heading]
            found[row] = both / max(float(np.linalg.norm(both)), 1e-12)
    return found, vectors[len(inputs) + len(headings) :]
