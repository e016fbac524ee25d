"""The answerer without an LLM: the sources' sentences closest to the question, cited."""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType

import numpy as np
from numpy.typing import NDArray

from core.ports import Embedder

log = logging.getLogger(__name__)

# Two sentences this close in meaning say the same thing; the answer keeps one.
NEAR_DUPLICATE = 0.9
# Sentences this far below the best match add noise, not answers.
RELATIVE_MARGIN = 0.1

UNVERIFIED: Mapping[str, str] = MappingProxyType(
    {
        "en": "I couldn't verify this from the information on our website.",
        "nl": "Ik kon dit niet controleren aan de hand van de informatie op onze website.",
        "de": "Das konnte ich anhand der Informationen auf unserer Website nicht überprüfen.",
        "fr": "Je n'ai pas pu vérifier cela à partir des informations de notre site web.",
    }
)
CONTACT: Mapping[str, str] = MappingProxyType(
    {
        "en": "You can reach us at {route}.",
        "nl": "Je kunt ons bereiken via {route}.",
        "de": "Sie erreichen uns unter {route}.",
        "fr": "Vous pouvez nous contacter via {route}.",
    }
)


@dataclass(frozen=True, slots=True)
class ExtractiveAnswer:
    text: str
    citations: tuple[int, ...]  # 1-based source numbers, in order of first citation
    answered: bool


@dataclass(frozen=True, slots=True)
class Sentence:
    """A quotable sentence of a source."""

    source: int  # 0-based index into the sources
    text: str


_HEADING = re.compile(r"^\s{0,3}#{1,6}\s")
_LIST_ITEM = re.compile(r"^\s*(?:[-*+•]|\d{1,3}[.)])\s+(?P<item>.+)$")
_TABLE_ROW = re.compile(r"^\s*\|(?P<cells>.*)\|\s*$")
_TABLE_RULE = re.compile(r"^[\s|:\-]+$")
_SENTENCE_END = re.compile(r"(?<=[.!?…])\s+(?=[\"'(\[«„]?[A-ZÀ-ÖØ-Þ0-9])")
# Abbreviations that end with a full stop but not a sentence, in our languages.
_ABBREVIATION = re.compile(
    r"(?:\b(?:e\.g|i\.e|etc|approx|incl|excl|vs|no|nr|ca|max|min|tel|bijv|bv|o\.a|d\.w\.z|"
    r"m\.b\.t|z\.B|u\.a|usw|bzw|ggf|evtl|inkl|p\.ex|env|cf|dr|mr|mrs|ms|st)|\b[A-Z])\.$",
    re.IGNORECASE,
)
_MIN_WORDS = 3


def _language(language: str | None) -> str:
    base = (language or "en").strip().lower().replace("_", "-").split("-")[0]
    return base if base in UNVERIFIED else "en"


def _split_paragraph(paragraph: str) -> Iterator[str]:
    pending = ""
    for piece in _SENTENCE_END.split(paragraph):
        pending = f"{pending} {piece}" if pending else piece
        if not _ABBREVIATION.search(pending):
            yield pending
            pending = ""
    if pending:
        yield pending


def _table_sentence(cells: list[str], header: list[str] | None) -> str:
    """A table row as a sentence: "Country: Belgium; Delivery: 2-3 days" when headed."""
    if header and len(header) == len(cells):
        return "; ".join(f"{h}: {c}" for h, c in zip(header, cells, strict=True) if c)
    return ", ".join(c for c in cells if c)


def _pieces(text: str) -> Iterator[str]:
    """Sentence-like pieces of one source: paragraph sentences, list items, table rows."""
    paragraph: list[str] = []
    header: list[str] | None = None
    in_table = False

    def flush() -> Iterator[str]:
        if paragraph:
            yield from _split_paragraph(" ".join(paragraph))
            paragraph.clear()

    for line in text.splitlines():
        row = _TABLE_ROW.match(line)
        if row is None:
            in_table, header = False, None
        if not line.strip() or _HEADING.match(line):
            yield from flush()
        elif row is not None:
            yield from flush()
            cells = [cell.strip() for cell in row["cells"].split("|")]
            if _TABLE_RULE.match(line):
                continue
            if not in_table:
                in_table, header = True, cells  # the first row names the columns
                continue
            yield _table_sentence(cells, header)
        elif item := _LIST_ITEM.match(line):
            yield from flush()
            yield item["item"].strip()
        else:
            paragraph.append(line.strip())
    yield from flush()


def split_sentences(sources: Sequence[str]) -> list[Sentence]:
    """The sentences worth quoting, in source order, each once."""
    seen: set[str] = set()
    sentences = []
    for index, text in enumerate(sources):
        for piece in _pieces(text):
            key = " ".join(piece.casefold().split())
            if len(piece.split()) < _MIN_WORDS or key in seen:
                continue
            seen.add(key)
            sentences.append(Sentence(index, piece))
    return sentences


def _cite(sentence: Sentence) -> str:
    text = sentence.text.rstrip()
    marker = f"[{sentence.source + 1}]"
    if text[-1:] in ".!?":
        return f"{text[:-1].rstrip()} {marker}{text[-1]}"
    return f"{text} {marker}"


def _not_answered(language: str | None, contact_route: str) -> ExtractiveAnswer:
    lang = _language(language)
    text = UNVERIFIED[lang]
    route = contact_route.strip().rstrip(".")
    if route:
        text += " " + CONTACT[lang].format(route=route)
    return ExtractiveAnswer(text, (), answered=False)


_WORD = re.compile(r"\w{3,}")
RARE_WORD_WEIGHT = 0.15
# Two questions asking the same thing score about 0.7 with the bundled encoder.
FAQ_QUESTION_SIMILARITY = 0.55


def _words(text: str) -> set[str]:
    return {w.casefold() for w in _WORD.findall(text)}


def _rare_word_bonus(question: str, sentences: Sequence[Sentence]) -> NDArray[np.float32]:
    """Up to RARE_WORD_WEIGHT for sharing the question's rarer words ("België" in one table
    row among many about delivery): the encoder alone prefers a general introduction."""
    asked = _words(question)
    words = [_words(s.text) & asked for s in sentences]
    frequency = {w: sum(w in found for found in words) for w in asked}
    weight = {w: math.log((len(sentences) + 1) / (n + 1)) for w, n in frequency.items() if n}
    total = sum(weight.values())
    if total <= 0:
        return np.zeros(len(sentences), dtype=np.float32)
    return np.array(
        [RARE_WORD_WEIGHT * sum(weight[w] for w in found) / total for found in words],
        dtype=np.float32,
    )


def _questions_point_at_answers(
    sentences: Sequence[Sentence], scores: NDArray[np.float32]
) -> NDArray[np.float32]:
    """A question in a source (an FAQ entry) is never the answer. When it is the visitor's
    question in other words, its match passes to the sentence that follows it in the same
    source, which usually is the answer; a question merely on the same topic passes nothing."""
    scores = scores.copy()
    for index, sentence in enumerate(sentences):
        if not sentence.text.rstrip().endswith("?"):
            continue
        following = index + 1
        same_question = scores[index] >= FAQ_QUESTION_SIMILARITY
        if (
            same_question
            and following < len(sentences)
            and sentences[following].source == sentence.source
        ):
            scores[following] = max(scores[following], scores[index])
        scores[index] = -1.0
    return scores


def _choose(
    scores: NDArray[np.float32],
    vectors: NDArray[np.float32],
    max_sentences: int,
    min_similarity: float,
) -> list[int]:
    """Indexes of the best sentences above the floor, skipping near-duplicates."""
    chosen: list[int] = []
    best = float(scores.max()) if scores.size else 0.0
    floor = max(min_similarity, best - RELATIVE_MARGIN)
    for index in np.argsort(-scores, kind="stable"):
        if len(chosen) == max_sentences or scores[index] < floor:
            break
        if any(float(vectors[index] @ vectors[other]) >= NEAR_DUPLICATE for other in chosen):
            continue
        chosen.append(int(index))
    return sorted(chosen)  # source order reads better than score order


async def extractive_answer(
    question: str,
    sources: Sequence[str],
    embedder: Embedder,
    *,
    language: str | None,
    contact_route: str,
    max_sentences: int = 3,
    min_similarity: float = 0.35,
) -> ExtractiveAnswer:
    """Up to ``max_sentences`` sentences of the sources (source i cited as [i+1]) that answer
    ``question``; when none is close enough, a message in ``language`` with the contact route.
    """
    sentences = split_sentences(sources)
    if not sentences or not question.strip():
        return _not_answered(language, contact_route)
    vectors = await embedder.embed([question, *(s.text for s in sentences)])
    rows = vectors[1:]
    similarity = rows @ vectors[0] + _rare_word_bonus(question, sentences)
    scores = _questions_point_at_answers(sentences, similarity)
    chosen = _choose(scores, rows, max_sentences, min_similarity)
    log.debug(
        "extractive.scored sentences=%d best=%.3f chosen=%d",
        len(sentences),
        float(scores.max()),
        len(chosen),
    )
    if not chosen:
        return _not_answered(language, contact_route)
    picked = [sentences[i] for i in chosen]
    citations = tuple(dict.fromkeys(s.source + 1 for s in picked))
    return ExtractiveAnswer(" ".join(_cite(s) for s in picked), citations, answered=True)
