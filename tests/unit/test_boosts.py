"""Boosts: current page, policy intent, product codes; they never change the match."""

from __future__ import annotations

import pytest

from core.retrieval.boosts import (
    CURRENT_PAGE_BOOST,
    POLICY_BOOST,
    PRODUCT_CODE_BOOST,
    QuerySignals,
    boost_for,
    same_page,
)


def _boost(
    question: str,
    *,
    url: str = "/en/p/boot",
    page_type: str = "page",
    text: str = "",
    match: float = 0.5,
    page_url: str | None = None,
    threshold: float = 0.4,
):  # type: ignore[no-untyped-def]
    return boost_for(
        signals=QuerySignals.of(question),
        url=url,
        page_type=page_type,
        text=text,
        match=match,
        threshold=threshold,
        page_url=page_url,
    )


@pytest.mark.parametrize(
    "question",
    [
        "Is this one waterproof?",
        "Is deze ook in rood?",
        "Gibt es dieser Schuh in 44?",
        "C'est disponible ici ?",
    ],
)
def test_current_page_boost_when_the_question_points_at_it(question: str) -> None:
    boost = _boost(question, match=0.1, page_url="https://shop.example/en/p/boot/")
    assert boost.amount == pytest.approx(CURRENT_PAGE_BOOST)
    assert boost.reasons == ("current_page",)


def test_current_page_boost_when_its_match_is_close_to_the_threshold() -> None:
    assert _boost("waterproof?", match=0.26, page_url="/en/p/boot").amount == pytest.approx(
        CURRENT_PAGE_BOOST
    )
    assert _boost("waterproof?", match=0.24, page_url="/en/p/boot").amount == 0
    assert _boost("Is this waterproof?", page_url="/en/p/other").amount == 0


@pytest.mark.parametrize(
    "question",
    [
        "How much is shipping?",
        "Wat kost verzending naar België?",
        "Wie lange dauert der Versand?",
        "Quels sont les frais de livraison ?",
        "Can I return my order?",
        "Kan ik achteraf betalen?",
    ],
)
def test_policy_questions_favour_policy_pages(question: str) -> None:
    boost = _boost(question, page_type="policy", threshold=0.4)
    assert boost.amount == pytest.approx(POLICY_BOOST)
    assert boost.threshold == pytest.approx(0.3)
    assert _boost(question, page_type="product").amount == 0


def test_product_code_matches_only_whole_codes() -> None:
    text = "The Fjord boot (NK-2041) is waterproof."
    assert _boost("is nk-2041 waterproof?", text=text).amount == pytest.approx(PRODUCT_CODE_BOOST)
    assert _boost("is NK-204 waterproof?", text=text).amount == 0
    assert QuerySignals.of("RAL7016 paint and NK-2041").product_codes == ("NK-2041", "RAL7016")
    assert QuerySignals.of("shipping in 2-3 days to 3011AB?").product_codes == ("3011AB",)


def test_same_page_ignores_host_only_when_one_side_has_none() -> None:
    assert same_page("/en/a", "https://shop.example/en/a")
    assert not same_page("https://other.example/en/a", "https://shop.example/en/a")
