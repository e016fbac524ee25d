"""The bot's fixed sentences exist in every language it answers in without a model."""

from __future__ import annotations

import pytest

from core.answer.escalation import DEFAULT_HANDOFF_TEXTS, DEFAULT_OUT_OF_HOURS_TEXTS
from core.answer.guard import REFUSALS, refusal
from core.answer.phrases import LANGUAGES, deferral, language_name, phrase
from core.answer.question import Question, guess_language, numeral


@pytest.mark.parametrize(
    "table", [DEFAULT_HANDOFF_TEXTS, DEFAULT_OUT_OF_HOURS_TEXTS, REFUSALS], ids=repr
)
def test_every_fixed_sentence_table_covers_the_six_languages(table: dict[str, str]) -> None:
    assert set(LANGUAGES) <= set(table)
    assert len({table[lang] for lang in LANGUAGES}) == len(LANGUAGES)


@pytest.mark.parametrize("name", ["unverified", "contact", "only_in", "not_listed", "holding"])
def test_each_phrase_differs_per_language(name: str) -> None:
    texts = {phrase(name, lang, route="x", other="y", thing="z") for lang in LANGUAGES}
    assert len(texts) == len(LANGUAGES)


def test_regional_and_unknown_languages_fall_back_sensibly() -> None:
    assert phrase("unverified", "nl-BE") == phrase("unverified", "nl")
    assert phrase("unverified", "pt") == phrase("unverified", "en")
    assert refusal("it-IT") == REFUSALS["it"]
    assert deferral("es", "") == phrase("unverified", "es")
    assert language_name("nl", "de") == "Niederländisch"


@pytest.mark.parametrize(
    ("text", "language"),
    [
        ("wat kost de Stormvang 3L?", "nl"),
        ("und was kostet er?", "de"),
        ("en wat kost hij?", "nl"),
        ("how much is it", "en"),
        ("Öffnungszeiten", "de"),  # no function word: the letters are clear enough
        ("Komforttemperatur vom Winterslaap?", "de"),
    ],
)
def test_short_messages_are_recognised_by_their_function_words(text: str, language: str) -> None:
    assert guess_language(text) == language


@pytest.mark.parametrize(
    ("text", "wants", "yes_no"),
    [
        ("How much is the Fjellsti Mid WP?", {"price"}, False),
        ("en wat kost hij?", {"price"}, False),
        ("Is the Winterslaap in stock?", {"availability"}, True),
        ("Can I pay with Bitcoin", set(), True),
        ("Liefert ihr nach Österreich?", set(), True),
        ("Wie lange dauert der Versand nach Belgien?", {"duration"}, False),
        ("Store opening hours?", {"hours"}, False),
        # the last part of a compound names the kind
        ("Komforttemperatur vom Winterslaap?", {"temperature"}, False),
        ("wat zijn de verzendkosten naar België", {"price"}, False),
        ("Telefonnummer vom Kundenservice?", {"contact"}, False),  # not a product code
        ("rekenen jullie transactiekosten bij creditcard?", {"price"}, True),
        ("Do you charge extra for PayPal?", {"price"}, True),
        # "open" asks for hours of a place or on a day, not of a parcel
        ("Is the store open on Sunday?", {"hours"}, True),
        ("Mag ik sokken terugsturen als de verpakking open is?", set(), True),
    ],
)
def test_a_question_is_read_for_the_fact_it_wants(text: str, wants: set[str], yes_no: bool) -> None:
    question = Question.read(text, "en")
    assert question.wants == wants
    assert question.yes_no is yes_no


def test_a_name_is_read_whole_and_a_bare_name_tells_no_language() -> None:
    assert Question.read("Do you charge extra for paying with PayPal?", "en").names == ("PayPal",)
    assert guess_language("Bitcoin?") is None
    assert guess_language("kostet PayPal extra?") is None  # too little to go on


def test_digits_and_number_words_are_the_same_number() -> None:
    assert numeral("3") == numeral("three") == numeral("drie") == numeral("drei") == "3"
    assert numeral("een") is None  # an article as much as a number
    assert numeral("pack") is None
