"""Which questions need the conversation to be understood, and the deterministic fallback."""

from __future__ import annotations

import pytest

from core.answer.gaps import gap_reason
from core.answer.rewrite import heuristic_rewrite, is_follow_up

HISTORY = [
    ("visitor", "Do you sell the Fjord GTX boot?"),
    ("assistant", "Yes, for 189.95 EUR [1]."),
]


@pytest.mark.parametrize(
    "question",
    [
        "and the blue one?",
        "en in welk jaar?",
        "Und wie lange dauert das?",
        "et pour la Belgique ?",
        "How much is it?",
        "Is deze waterdicht?",
        "size 44?",
    ],
)
def test_follow_ups_need_a_rewrite(question: str) -> None:
    assert is_follow_up(question, HISTORY)


@pytest.mark.parametrize(
    "question",
    [
        "How long does delivery to Belgium take for an order placed today?",
        "Welke betaalmethoden accepteren jullie bij een bestelling in de webshop?",
    ],
)
def test_self_contained_questions_go_verbatim(question: str) -> None:
    assert not is_follow_up(question, HISTORY)


def test_the_first_turn_is_never_rewritten() -> None:
    assert not is_follow_up("and the blue one?", [])


def test_heuristic_carries_the_topic_of_the_last_visitor_message() -> None:
    assert (
        heuristic_rewrite("and the blue one?", HISTORY)
        == "Do you sell the Fjord GTX boot? and the blue one?"
    )


@pytest.mark.parametrize(
    ("answer", "low", "reason"),
    [
        ("Delivery takes 2-3 days [1].", False, None),
        ("Delivery takes 2-3 days [1].", True, "weak_match"),
        ("Sorry, I can't find that in our information.", False, "deferred"),
        ("Dat kan ik niet vinden in onze informatie.", False, "deferred"),
        ("Das weiß ich nicht, bitte kontaktieren Sie uns.", False, "deferred"),
        ("Je ne sais pas, contactez-nous.", False, "deferred"),
    ],
)
def test_content_gaps(answer: str, low: bool, reason: str | None) -> None:
    assert gap_reason(answer, low) == reason
