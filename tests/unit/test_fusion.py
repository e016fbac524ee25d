"""Calibrated fusion: exact lexical matches are taken at their word, cross-lingual hits are kept."""

from __future__ import annotations

from itertools import count

import pytest

from core.retrieval.fusion import EXACT_FROM, calibrated, fuse
from core.store.search import Candidate

_ids = count(1)


def candidate(
    url: str,
    *,
    locale: str,
    dense: float,
    lexical: float = 0.0,
    exactness: float = 0.0,
    heading: str = "",
) -> Candidate:
    chunk_id = next(_ids)
    return Candidate(
        chunk_id=chunk_id,
        page_id=chunk_id,
        url=url,
        title=heading,
        heading=heading,
        text="",
        locale=locale,
        page_type="page",
        tags=(),
        dense=dense,
        lexical=lexical,
        exactness=exactness,
    )


def order(dense: list[Candidate], lexical: list[Candidate], language: str) -> list[str]:
    return [f.candidate.url for f in calibrated(dense, lexical, language)]


def test_a_heading_that_is_the_query_wins_over_a_denser_neighbour() -> None:
    # "Kan ik mijn bestelling wijzigen of annuleren?" typed as it stands in the FAQ.
    exact = candidate(
        "/faq/wijzigen",
        locale="nl",
        dense=0.42,
        lexical=0.80,
        exactness=1.0,
        heading="Veelgestelde vragen > Kan ik mijn bestelling wijzigen of annuleren?",
    )
    neighbour = candidate("/faq/verzending", locale="nl", dense=0.61, lexical=0.85, exactness=0.4)
    assert order([neighbour, exact], [neighbour, exact], "nl")[0] == "/faq/wijzigen"


def test_an_exact_match_wins_even_when_another_language_leads_by_meaning() -> None:
    # An English page among the closest switches the cross-lingual rule on, which takes
    # away the own-language pages' word evidence; a word-for-word heading keeps its bonus.
    exact = candidate("/nl/retour", locale="nl", dense=0.22, lexical=0.81, exactness=1.0)
    english = candidate("/warranty", locale="en", dense=0.31, lexical=0.10)
    other = candidate("/nl/faq", locale="nl", dense=0.25, lexical=0.30, exactness=0.3)
    assert order([english, other, exact], [exact, other, english], "nl")[0] == "/nl/retour"


def test_a_cross_lingual_dense_hit_is_not_pushed_down_by_accidental_word_matches() -> None:
    # A Dutch question whose answer exists only in English: the Dutch pages share a word or
    # two with it ("garantie" in a link), which is no reason to rank them first.
    answer = candidate("/warranty", locale="en", dense=0.56)
    accidental = [
        candidate(f"/nl/page-{i}", locale="nl", dense=0.48 - i / 100, lexical=0.8, exactness=0.5)
        for i in range(3)
    ]
    ranked = order([answer, *accidental], accidental, "nl")
    assert ranked[0] == "/warranty"


def test_below_the_bar_exactness_earns_nothing() -> None:
    near = candidate("/a", locale="en", dense=0.40, lexical=0.5, exactness=EXACT_FROM - 0.01)
    plain = candidate("/b", locale="en", dense=0.40, lexical=0.5)
    scores = {f.candidate.url: f.score for f in calibrated([near, plain], [near, plain], "en")}
    assert scores["/a"] == scores["/b"]


def test_word_for_word_beats_nearly_word_for_word() -> None:
    # Two FAQ questions that differ by one word: the one typed exactly is meant.
    typed = candidate("/faq/change", locale="en", dense=0.45, lexical=0.7, exactness=1.0)
    similar = candidate("/faq/cancel", locale="en", dense=0.60, lexical=0.7, exactness=0.8)
    assert order([similar, typed], [similar, typed], "en")[0] == "/faq/change"


def test_of_two_exact_twins_the_questions_own_language_comes_first() -> None:
    dutch = candidate("/nl/paypal", locale="nl", dense=0.65, lexical=0.69, exactness=1.0)
    english = candidate("/en/paypal", locale="en", dense=0.66, lexical=0.69, exactness=1.0)
    assert order([english, dutch], [english, dutch], "nl")[0] == "/nl/paypal"
    assert order([english, dutch], [english, dutch], "en")[0] == "/en/paypal"


def test_without_an_exact_match_scores_are_similarity_plus_word_evidence() -> None:
    a = candidate("/a", locale="en", dense=0.50, lexical=0.2, exactness=0.5)
    b = candidate("/b", locale="en", dense=0.45, lexical=0.9, exactness=0.6)
    c = candidate("/c", locale="en", dense=0.30)
    fused = fuse([a, b, c], [b, a], "en")
    assert [f.candidate.url for f in fused] == ["/b", "/a", "/c"]
    assert fused[0].score == pytest.approx(0.45 + 0.35 * 1.0)


def test_rrf_ignores_exactness() -> None:
    a = candidate("/a", locale="en", dense=0.5, lexical=0.2, exactness=1.0)
    b = candidate("/b", locale="en", dense=0.6, lexical=0.9)
    fused = fuse([b, a], [b, a], "en", strategy="rrf")
    assert [f.candidate.url for f in fused] == ["/b", "/a"]
