"""Curated-answer patterns are matched by RE2: linear in the text whatever staff wrote."""

from __future__ import annotations

import time

import pytest

from core.answer.curated import match_curated
from core.errors import InvalidInput
from core.patterns import compile_pattern
from core.retrieval.embedders import UseEmbedder
from core.store.curated import CuratedAnswer

# The pattern and the text of the finding: with a backtracking engine, seconds to minutes.
CATASTROPHIC = r"^(\w+\s?)+$"
EVIL = "a" * 27 + "!"


def _answer(pattern: str) -> CuratedAnswer:
    return CuratedAnswer(1, "", (), pattern, "Our canned reply.", None)


async def test_a_catastrophic_pattern_answers_at_once(use_embedder: UseEmbedder) -> None:
    started = time.perf_counter()
    assert await match_curated(EVIL, None, [_answer(CATASTROPHIC)], use_embedder) is None
    assert time.perf_counter() - started < 2.0  # a backtracking engine: 15 s and more
    # linear: a text of 100,000 characters (25 times the longest message) is matched too
    long = ("a" * 99 + " ") * 1000 + "!"
    assert await match_curated(long, None, [_answer(CATASTROPHIC)], use_embedder) is None
    reply = await match_curated("Größe prüfen", None, [_answer(CATASTROPHIC)], use_embedder)
    assert reply is not None


async def test_patterns_are_read_as_re2_reads_them(use_embedder: UseEmbedder) -> None:
    # \p{Lu} is RE2 syntax (Python's re has no \p): the pattern is matched by RE2
    coded = _answer(r"\b\p{Lu}{2}-\d{4}\b")
    assert await match_curated("where is NK-2041?", None, [coded], use_embedder) is not None
    # case is ignored, for accented letters too
    assert await match_curated("RÜCKGABE", None, [_answer("rückgabe")], use_embedder)
    # \w, \d and \s keep the Unicode meaning they have in Python's re
    assert compile_pattern(r"^\w+$").search("Größe")
    assert compile_pattern(r"^[\w-]+\s\d$").search("Rück-gabe\u00a0٣")
    assert not compile_pattern(r"^\W$").search("ß")
    assert compile_pattern(r"end\Z").search("the end")


@pytest.mark.parametrize(
    ("pattern", "reason"),
    [
        (r"(?<!not )happy", "invalid perl operator: (?<!"),
        (r"(ab)\1", "invalid escape sequence: \\1"),
        (r"(unclosed", "missing )"),
    ],
)
def test_a_pattern_re2_cannot_match_is_refused_with_the_reason(pattern: str, reason: str) -> None:
    with pytest.raises(InvalidInput) as refused:
        compile_pattern(pattern)
    assert reason in refused.value.message
    assert "RE2 syntax" in refused.value.message


async def test_a_stored_pattern_re2_cannot_match_is_skipped(use_embedder: UseEmbedder) -> None:
    # saved before patterns were checked with RE2: never matched, never an error
    assert await match_curated("happy", None, [_answer(r"(?<!not )happy")], use_embedder) is None
