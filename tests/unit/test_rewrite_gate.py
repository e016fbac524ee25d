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
        "Do you repair bicycles?",
        "Verkopen jullie kano's?",
        "Verzending naar België?",
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


@pytest.mark.parametrize(
    "question", ["and how much does it cost?", "en wat kost hij?", "und was kostet er?"]
)
def test_a_first_question_that_points_at_the_page_is_made_about_the_page(question: str) -> None:
    assert is_follow_up(question, [], page_subject="Fjellsti Mid WP")
    assert heuristic_rewrite(question, [], "Fjellsti Mid WP") == f"Fjellsti Mid WP: {question}"


@pytest.mark.parametrize(
    "question",
    ["How long does delivery to Belgium take?", "Wie lange dauert die Lieferung?",
     "How much is the Fjellsti Mid WP?"],
)  # fmt: skip
def test_a_first_question_that_stands_alone_is_searched_as_asked(question: str) -> None:
    assert not is_follow_up(question, [], page_subject="Fjellsti Mid WP")


def test_a_follow_up_on_a_page_keeps_both_the_page_and_the_previous_question() -> None:
    history = [("visitor", "which colours does this jacket come in?"), ("assistant", "...")]
    assert heuristic_rewrite("and in red?", history, "Stormvang 3L") == (
        "Stormvang 3L: which colours does this jacket come in? and in red?"
    )
