"""The extractive answerer with the real multilingual encoder: quotes, citations, fallbacks."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest
from numpy.typing import NDArray

from core.answer.extractive import (
    ExtractiveAnswer,
    Passage,
    Sentence,
    extractive_answer,
    split_sentences,
    subject_of,
)
from core.answer.phrases import LANGUAGES, phrase
from core.answer.question import Question
from core.retrieval.embedders import UseEmbedder

ABOUT = (
    "Acme Running was founded in 2009 in Utrecht by two marathon runners. "
    "Our shop has a café and a treadmill for gait analysis."
)
SHIPPING_EN = """# Shipping and delivery

Below you can see how long delivery takes to your country and what it costs.

| Country | Delivery time | Cost |
|---|---|---|
| Netherlands | 1-2 working days | €3.95 |
| Belgium | 2-3 working days | €4.95 |
| Germany | 3-4 working days | €6.95 |

## Returns
- You can return items within 30 days of delivery.
- Returned items must be unused and in their original packaging.
"""
SHIPPING_NL = """## Verzending
Bestellingen naar België worden binnen 2-3 werkdagen bezorgd. Verzending is gratis vanaf €50.
"""
PAYMENT = """# Payment methods

You can pay with the following methods:

- iDEAL
- Credit card: Visa and Mastercard
- PayPal
- Klarna: pay within 30 days
"""
TRAIL_SHOE = """# Trailrunner 2

- Price: €129.95
- Availability: In stock

The Trailrunner 2 is light and breathable. The shoe is not waterproof.
"""
RAIN_JACKET = """# Regenjas Pro

- Price: €199.00

The Regenjas Pro rain jacket is fully waterproof and windproof. Taped seams keep the rain out.
"""
ROUTE = "support@acme.example or +31 20 123 4567"


class CountingEmbedder:
    """The real encoder, counting how many texts it is asked to encode."""

    def __init__(self, inner: UseEmbedder) -> None:
        self.inner = inner
        self.calls: list[int] = []
        self.name = inner.name
        self.dimension = inner.dimension

    async def embed(self, texts: Sequence[str]) -> NDArray[np.float32]:
        self.calls.append(len(texts))
        return await self.inner.embed(texts)


@pytest.fixture
def embedder(use_embedder: UseEmbedder) -> CountingEmbedder:
    return CountingEmbedder(use_embedder)


async def ask(
    embedder: CountingEmbedder,
    text: str,
    sources: Sequence[Passage | str],
    language: str = "en",
    *,
    contact_route: str = ROUTE,
    latest: str | None = None,
) -> ExtractiveAnswer:
    passages = [s if isinstance(s, Passage) else Passage("", s, "en") for s in sources]
    return await extractive_answer(
        Question.read(text, language, latest=latest),
        passages,
        embedder,
        contact_route=contact_route,
    )


async def test_a_table_answers_with_the_row_of_the_country_asked_about(
    embedder: CountingEmbedder,
) -> None:
    result = await ask(embedder, "How long does shipping to Belgium take?", [ABOUT, SHIPPING_EN])
    assert result.answered
    assert result.text == "Country: Belgium; Delivery time: 2-3 working days; Cost: €4.95 [2]."
    assert result.citations == (2,)


async def test_the_visitors_own_words_pick_the_row_of_a_follow_up(
    embedder: CountingEmbedder,
) -> None:
    result = await ask(
        embedder,
        "How long does shipping to Belgium take? and Germany?",
        [SHIPPING_EN],
        latest="and Germany?",
    )
    assert "Germany; Delivery time: 3-4 working days" in result.text
    assert "Belgium" not in result.text


async def test_an_announcement_of_content_is_never_the_answer(
    embedder: CountingEmbedder,
) -> None:
    result = await ask(embedder, "What does delivery cost?", [SHIPPING_EN])
    assert result.answered
    assert "Below you can see" not in result.text


async def test_a_labelled_fact_answers_a_price_question_and_names_the_product(
    embedder: CountingEmbedder,
) -> None:
    shoe = Passage("Trailrunner 2 – Light trail shoe | Acme Running", TRAIL_SHOE, "en")
    result = await ask(embedder, "How much is the Trailrunner 2?", [shoe])
    assert result.answered
    assert "Trailrunner 2 – Price: €129.95" in result.text
    assert result.evidence.wanted_found


async def test_statements_about_two_products_are_not_mixed(
    embedder: CountingEmbedder,
) -> None:
    jacket = Passage("Regenjas Pro | Acme", RAIN_JACKET, "en", current=True)
    shoe = Passage("Trailrunner 2 | Acme", TRAIL_SHOE, "en")
    result = await ask(
        embedder,
        "Regenjas Pro is this jacket waterproof?",
        [shoe, jacket],
        latest="is this jacket waterproof?",
    )
    assert result.text.startswith("Yes.")
    assert "fully waterproof" in result.text
    assert "not waterproof" not in result.text
    assert result.citations == (2,)


async def test_a_yes_no_question_the_content_negates_gets_no(
    embedder: CountingEmbedder,
) -> None:
    shoe = Passage("Trailrunner 2 | Acme", TRAIL_SHOE, "en", current=True)
    result = await ask(embedder, "Trailrunner 2 is it waterproof?", [shoe], latest="is it?")
    assert result.text.startswith("No.")
    assert "not waterproof" in result.text


async def test_something_a_complete_list_leaves_out_gets_a_no_with_the_list(
    embedder: CountingEmbedder,
) -> None:
    result = await ask(embedder, "Can I pay with Bitcoin?", [PAYMENT])
    assert result.text.startswith("No, Bitcoin is not among them.")
    assert "iDEAL" in result.text
    assert "PayPal" in result.text


async def test_a_dutch_only_answer_is_announced_in_the_visitors_language(
    embedder: CountingEmbedder,
) -> None:
    dutch = Passage("Verzending | Acme", SHIPPING_NL, "nl")
    result = await ask(embedder, "How long does shipping to Belgium take?", [dutch])
    assert result.answered
    assert result.text == (
        "This information is only available in Dutch: "
        "Bestellingen naar België worden binnen 2-3 werkdagen bezorgd [1]."
    )


@pytest.mark.parametrize("language", [*LANGUAGES, "pt", "de-DE"])
async def test_a_question_the_sources_cannot_answer_points_to_the_contact_route(
    embedder: CountingEmbedder, language: str
) -> None:
    result = await ask(embedder, "What is the capital of Peru?", [SHIPPING_NL], language)
    expected = phrase("unverified", language) + " " + phrase("contact", language, route=ROUTE)
    if not result.answered:
        assert result.text == expected
    assert result.evidence.similarity < 0.3


async def test_the_deferral_exists_in_every_fixed_language() -> None:
    texts = {phrase("unverified", language) for language in LANGUAGES}
    assert len(texts) == len(LANGUAGES)


async def test_no_sources_need_no_embedding(embedder: CountingEmbedder) -> None:
    result = await ask(embedder, "How long does shipping take?", [], "de", contact_route="x.de")
    assert result.text == f"{phrase('unverified', 'de')} Sie erreichen uns unter x.de."
    assert embedder.calls == []
    assert not result.answered


async def test_the_similarity_floor_decides(embedder: CountingEmbedder) -> None:
    strict = await extractive_answer(
        Question.read("How long does shipping to Belgium take?", "en"),
        [Passage("", SHIPPING_EN)],
        embedder,
        contact_route="",
        min_similarity=2.0,
    )
    assert not strict.answered
    assert strict.text == phrase("unverified", "en")


async def test_a_repeated_sentence_is_quoted_once(embedder: CountingEmbedder) -> None:
    sources = [
        "Orders to Belgium arrive within 2-3 working days. Choose the larger size.",
        "Orders to Belgium arrive within 2-3 working days! Choose the larger size.",
    ]
    result = await ask(embedder, "How long does shipping to Belgium take?", sources)
    assert result.text.count("Orders to Belgium arrive") == 1


def test_a_page_title_names_its_subject() -> None:
    title = "Fjellsti Mid WP – Waterproof hiking boot (NK-2041) | Noordkaap Outdoor"
    assert subject_of(title) == "Fjellsti Mid WP"
    assert subject_of("Shipping and delivery | Shop") == "Shipping and delivery"


def test_markdown_is_split_into_quotable_pieces_with_headings_and_blocks() -> None:
    assert split_sentences(
        [SHIPPING_EN, "Short one.\n\n1. Call us on +31 20 123 4567 any day"]
    ) == [
        Sentence(
            0,
            "Below you can see how long delivery takes to your country and what it costs.",
            "Shipping and delivery",
            paragraph=1,
        ),
        Sentence(
            0,
            "Country: Netherlands; Delivery time: 1-2 working days; Cost: €3.95",
            "Shipping and delivery",
            0,
            ("Country", "Delivery time", "Cost"),
            cells=("Netherlands", "1-2 working days", "€3.95"),
        ),
        Sentence(
            0,
            "Country: Belgium; Delivery time: 2-3 working days; Cost: €4.95",
            "Shipping and delivery",
            0,
            ("Country", "Delivery time", "Cost"),
            cells=("Belgium", "2-3 working days", "€4.95"),
        ),
        Sentence(
            0,
            "Country: Germany; Delivery time: 3-4 working days; Cost: €6.95",
            "Shipping and delivery",
            0,
            ("Country", "Delivery time", "Cost"),
            cells=("Germany", "3-4 working days", "€6.95"),
        ),
        Sentence(0, "You can return items within 30 days of delivery.", "Returns", 1),
        Sentence(0, "Returned items must be unused and in their original packaging.", "Returns", 1),
        Sentence(1, "Call us on +31 20 123 4567 any day", "", 2),
    ]


FAQ = """# FAQ

## Do you have a price promise?
Yes. If you find the same product cheaper elsewhere within 14 days, we refund the difference.
Send us a link to the offer.

## Can I rent gear?
Yes, we rent out tents in our store.
"""
SOCK_SIZES = """# Size guide

## Socks

| Sock size | Fits shoe sizes (EU) |
|---|---|
| S | 36–38 |
| M | 39–42 |
| L | 43–46 |
"""


async def test_an_faq_entry_is_answered_with_its_whole_answer(
    embedder: CountingEmbedder,
) -> None:
    result = await ask(embedder, "Do you have a price promise?", [FAQ])
    assert result.text.startswith("Yes. If you find the same product cheaper")
    assert "within 14 days" in result.text
    assert "rent" not in result.text
    assert result.evidence.faq


async def test_a_number_picks_the_row_whose_range_holds_it(embedder: CountingEmbedder) -> None:
    result = await ask(embedder, "Which sock size for shoe size 40?", [SOCK_SIZES])
    assert result.text == "Sock size: M; Fits shoe sizes (EU): 39–42 [1]."


async def test_the_product_named_answers_from_its_own_page(embedder: CountingEmbedder) -> None:
    jacket = Passage("Regenjas Pro | Acme", RAIN_JACKET, "en")
    shoe = Passage("Trailrunner 2 | Acme", TRAIL_SHOE, "en")
    result = await ask(embedder, "What does the Trailrunner 2 cost?", [jacket, shoe])
    assert result.text == "Trailrunner 2 – Price: €129.95 [2]."


ENCYCLOPEDIA = {
    "es": Passage(
        "La Torre Eiffel",
        "La torre Eiffel es una estructura de hierro diseñada por Gustave Eiffel. Fue "
        "construida entre 1887 y 1889 para la Exposición Universal de París. Mide 330 metros "
        "de altura y recibe unos siete millones de visitantes al año.",
        "es",
    ),
    "de": Passage(
        "Der Rhein",
        "Der Rhein ist ein Strom in Mitteleuropa. Er entspringt in den Schweizer Alpen und "
        "mündet in die Nordsee. Seine Länge beträgt etwa 1230 Kilometer. Wichtige Städte am "
        "Rhein sind Basel, Köln und Düsseldorf.",
        "de",
    ),
    "en": Passage(
        "Amazon river",
        "The Amazon is the largest river in the world by discharge volume. It flows through "
        "Brazil, Peru and Colombia. The river was named by Francisco de Orellana in 1542.",
        "en",
    ),
}


@pytest.mark.parametrize(
    ("language", "question", "span"),
    [
        ("es", "¿Cuándo fue construida la torre Eiffel?", "1887"),
        ("es", "¿Cuánto mide la torre Eiffel?", "330 metros"),
        ("es", "¿Quién diseñó la torre?", "Gustave Eiffel"),
        ("de", "Wie lang ist der Rhein?", "1230 Kilometer"),
        ("de", "In welches Meer mündet der Rhein?", "Nordsee"),
        ("en", "Who named the Amazon river?", "Orellana"),
        ("en", "When was the Amazon named?", "1542"),
    ],
)
async def test_a_paragraph_answers_with_the_sentence_holding_the_kind_of_fact_asked(
    embedder: CountingEmbedder, language: str, question: str, span: str
) -> None:
    """Not only shops: a date for "when", a length for "how long is", a name for "who"."""
    result = await ask(embedder, question, [ENCYCLOPEDIA[language]], language)
    assert span in result.text


async def test_a_whole_two_column_table_reads_as_label_and_value(
    embedder: CountingEmbedder,
) -> None:
    hours = """# Contact

## Store opening hours

| Day | Hours |
|---|---|
| Monday | 12:00–18:00 |
| Tuesday to Saturday | 10:00–18:00 |
| Sunday | closed |
"""
    result = await ask(embedder, "Store opening hours?", [hours])
    assert result.text == (
        "Store opening hours – Monday: 12:00–18:00; Tuesday to Saturday: 10:00–18:00; "
        "Sunday: closed [1]."
    )


REGIONS = """# Delivery

| Country | Delivery time | Cost |
|---|---|---|
| Germany | 2-3 working days | €6.95 |
| Other EU countries | 3-6 working days | €12.95 |
| United Kingdom | 4-7 working days | €19.95 |

## Returns

| Returning from | Who pays |
|---|---|
| Belgium | free |
| Germany | €4.95 |
"""


@pytest.mark.parametrize(
    ("question", "language"),
    [
        ("How long does delivery to Austria take?", "en"),
        ("Wie lange dauert die Lieferung nach Österreich?", "de"),
        ("Hoe lang duurt de levering naar Oostenrijk?", "nl"),
    ],
)
async def test_a_country_the_table_does_not_list_gets_the_row_of_its_region(
    embedder: CountingEmbedder, question: str, language: str
) -> None:
    result = await ask(embedder, question, [REGIONS], language)
    assert result.answered
    assert "Other EU countries; Delivery time: 3-6 working days" in result.text
    assert "Germany" not in result.text
    assert "United Kingdom" not in result.text


SOCK = """# Merino Trek Sock

- Price: €19.95 per pair
- Availability: In stock

## Price
€19.95 per pair, or €54.95 for a pack of three pairs.

## Why merino?
Merino wool keeps your feet warm when wet and does not smell after days of walking.
"""


async def test_a_number_in_figures_finds_the_same_number_in_words(
    embedder: CountingEmbedder,
) -> None:
    result = await ask(
        embedder,
        "price for a 3 pack of the merino trek socks?",
        [Passage("Merino Trek Sock", SOCK, "en")],
    )
    assert "€54.95" in result.text


async def test_a_yes_no_question_about_costs_is_settled_by_a_no_fee_statement(
    embedder: CountingEmbedder,
) -> None:
    payment = (
        "# Payment\n\nWe never charge a fee for any payment method.\n\n"
        "## Business customers\nPaying on account is possible for orders from €250.\n"
    )
    result = await ask(embedder, "Do you charge a fee for paying by credit card?", [payment])
    assert result.text.startswith("No.")
    assert "never charge a fee" in result.text


async def test_a_follow_up_puts_its_day_in_the_earlier_questions_place(
    embedder: CountingEmbedder,
) -> None:
    store = (
        "# Contact and store\n\n## Store opening hours\n\n| Day | Hours |\n|---|---|\n"
        "| Saturday | 10:00–17:00 |\n| Sunday | 12:00–17:00 |\n| Monday | closed |\n"
    )
    shipping = (
        "# Shipping\n\nIf you order on Friday after 15:00, on Saturday or on Sunday, "
        "we ship on Monday, when the store opens again at 10:00.\n"
    )
    result = await ask(
        embedder,
        "When is the store open on Saturday? and on Sunday?",
        [Passage("Shipping", shipping, "en"), Passage("Contact and store", store, "en")],
        latest="and on Sunday?",
    )
    assert "12:00–17:00" in result.text
    assert "we ship on Monday" not in result.text


# Help-centre articles: one entry per page, cross-linked by title.
APP_STORES = """# In which app stores is the app available?

The app is available in the app stores of Germany, Austria, Belgium and the Netherlands.
"""
GOOGLE_PLAY = """# The app is not shown in Google Play

The app is not available with Google Play for your country. See In which app stores is the app
available? for the supported countries.
"""
SLEEPING_BAG = """# Winterslaap Down

- Price: €289.00

## Temperature ratings

- Comfort: −5 °C
- Limit: −12 °C
- Extreme: −30 °C (survival only, not for sleeping)
"""
PAYMENT_PAGE = """# Payment methods

At Acme you pay safely and without extra costs. Below you can read which methods are available.

## Overview

- iDEAL (Dutch bank accounts)
- Credit card: Visa and Mastercard
- PayPal
- Apple Pay
"""
PAYMENT_PAGE_DE = """# Zahlungsarten

Bei Acme bezahlst du sicher und ohne Zusatzkosten. Hier erfährst du, welche Zahlungsarten es gibt.

## Überblick

- iDEAL (niederländische Bankkonten)
- Kreditkarte: Visa und Mastercard
- PayPal
- Apple Pay
"""


async def test_the_entry_that_asks_the_question_answers_not_one_pointing_at_it(
    embedder: CountingEmbedder,
) -> None:
    pointing = Passage("The app is not shown in Google Play", GOOGLE_PLAY, "en")
    entry = Passage("In which app stores is the app available?", APP_STORES, "en")
    for sources in ([pointing, entry], [entry, pointing]):
        result = await ask(embedder, "In which app stores is the app available?", sources)
        assert result.answered
        assert "Germany, Austria, Belgium and the Netherlands" in result.text
        assert "See In which" not in result.text
        assert result.citations == (sources.index(entry) + 1,)


async def test_several_values_of_the_fact_asked_are_named_in_the_pages_order(
    embedder: CountingEmbedder,
) -> None:
    bag = Passage("Winterslaap Down – Down sleeping bag | Acme", SLEEPING_BAG, "en", current=True)
    result = await ask(embedder, "How cold can I go with this sleeping bag?", [bag])
    assert result.answered
    comfort, limit, extreme = (result.text.index(s) for s in ("Comfort", "Limit", "Extreme"))
    assert comfort < limit < extreme


@pytest.mark.parametrize(
    ("question", "language", "page"),
    [
        ("Which payment methods do you accept?", "en", PAYMENT_PAGE),
        ("What payment options are there?", "en", PAYMENT_PAGE),
        ("Welke betaalmethoden zijn er?", "nl", PAYMENT_PAGE),
        ("Welche Zahlungsarten gibt es?", "de", PAYMENT_PAGE_DE),
    ],
)
async def test_a_question_for_the_members_of_a_set_gets_the_list(
    embedder: CountingEmbedder, question: str, language: str, page: str
) -> None:
    source = Passage("Payment methods | Acme", page, "de" if "Zahlung" in page else "en")
    result = await ask(embedder, question, [source], language)
    assert result.answered
    for member in ("iDEAL", "Visa", "Mastercard", "PayPal", "Apple Pay"):
        assert member in result.text
    assert "Below you can read" not in result.text
    assert "Hier erfährst du" not in result.text


async def test_a_quote_that_opens_with_its_own_no_gets_no_second_one(
    embedder: CountingEmbedder,
) -> None:
    shoe = Passage(
        "Lichtvoet Low | Acme",
        "# Lichtvoet Low\n\nNo, the Lichtvoet Low shoes are not waterproof: they have no "
        "membrane, on purpose, so they breathe better and dry quickly.",
        "en",
        current=True,
    )
    result = await ask(embedder, "Are these shoes waterproof?", [shoe])
    assert result.text.startswith("No, the Lichtvoet Low shoes are not waterproof")


async def test_a_question_about_this_is_answered_from_the_page_the_visitor_is_on(
    embedder: CountingEmbedder,
) -> None:
    # On the shoe's page, a jacket that is all about being waterproof ranks first.
    shoe = Passage("Trailrunner 2 | Acme", TRAIL_SHOE, "en", current=True)
    jacket = Passage("Regenjas Pro – waterproof rain jacket | Acme", RAIN_JACKET, "en")
    for sources in ([jacket, shoe], [shoe, jacket]):
        result = await ask(embedder, "Are these waterproof?", sources)
        assert result.answered
        assert result.citations == (sources.index(shoe) + 1,)
        assert result.text.startswith("No.")


async def test_a_negation_about_something_else_gives_no_no(embedder: CountingEmbedder) -> None:
    klarna = """# Klarna

- Pay on account: you pay the full amount within 30 days of dispatch, without extra costs.
- Pay in three instalments: three equal parts, one a month.
"""
    result = await ask(embedder, "Can I pay on account?", [Passage("Klarna | Acme", klarna, "en")])
    assert result.answered
    assert "within 30 days" in result.text
    assert not result.text.startswith("No")
    # A negation next to what was asked still settles it.
    shoe = Passage("Trailrunner 2 | Acme", TRAIL_SHOE, "en", current=True)
    negated = await ask(embedder, "Is the Trailrunner 2 waterproof?", [shoe])
    assert negated.text.startswith("No.")
