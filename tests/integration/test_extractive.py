"""The extractive answerer with the real multilingual encoder: quotes, citations, fallbacks."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest
from numpy.typing import NDArray

from core.llm.extractive import UNVERIFIED, Sentence, extractive_answer, split_sentences
from core.retrieval.embedders import UseEmbedder

ABOUT = (
    "Acme Running was founded in 2009 in Utrecht by two marathon runners. "
    "Our shop has a café and a treadmill for gait analysis."
)
SHIPPING_EN = """# Shipping and delivery

We ship to the Netherlands, Belgium and Germany. Orders placed before 15:00 on a working
day ship the same day.

Orders to Belgium arrive within 2-3 working days. Shipping is free for orders above €50,
e.g. most shoe orders.

| Country | Delivery time | Cost |
|---|---|---|
| Netherlands | 1-2 working days | €3.95 |
| Belgium | 2-3 working days | €4.95 |

## Returns
- You can return items within 30 days of delivery.
- Returned items must be unused and in their original packaging.
"""
SHIPPING_NL = """## Verzending
Bestellingen naar België worden binnen 2-3 werkdagen bezorgd. Verzending is gratis vanaf €50.

## Retourneren
Je kunt artikelen binnen 30 dagen na levering retourneren.
"""
ROUTE = "support@acme.example or +31 20 123 4567"


class CountingEmbedder:
    """The real encoder, counting how often it is asked."""

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


async def test_an_english_question_is_answered_from_english_sources(
    embedder: CountingEmbedder,
) -> None:
    result = await extractive_answer(
        "How long does shipping to Belgium take?",
        [ABOUT, SHIPPING_EN],
        embedder,
        language="en",
        contact_route=ROUTE,
    )
    assert result.answered
    assert result.citations == (2,)
    assert "Orders to Belgium arrive within 2-3 working days [2]." in result.text
    assert "café" not in result.text
    assert result.text.count("[2]") <= 3
    # the question and every sentence in one call
    assert embedder.calls == [1 + len(split_sentences([ABOUT, SHIPPING_EN]))]


async def test_an_english_question_is_answered_from_dutch_sources(
    embedder: CountingEmbedder,
) -> None:
    result = await extractive_answer(
        "How long does shipping to Belgium take?",
        [ABOUT, SHIPPING_NL],
        embedder,
        language="en",
        contact_route=ROUTE,
    )
    assert result.answered
    assert result.text == "Bestellingen naar België worden binnen 2-3 werkdagen bezorgd [2]."
    assert result.citations == (2,)


async def test_sentences_from_several_sources_keep_source_order(
    embedder: CountingEmbedder,
) -> None:
    result = await extractive_answer(
        "How long does shipping to Belgium take?",
        [SHIPPING_NL, ABOUT, SHIPPING_EN],
        embedder,
        language="en",
        contact_route=ROUTE,
        max_sentences=2,
    )
    assert result.answered
    assert result.citations == (1, 3)
    assert result.text.index("[1]") < result.text.index("[3]")
    assert result.text.count("[") == 2


@pytest.mark.parametrize(
    ("language", "message", "contact"),
    [
        ("en", UNVERIFIED["en"], f"You can reach us at {ROUTE}."),
        ("nl", UNVERIFIED["nl"], f"Je kunt ons bereiken via {ROUTE}."),
        ("de-DE", UNVERIFIED["de"], f"Sie erreichen uns unter {ROUTE}."),
        ("fr", UNVERIFIED["fr"], f"Vous pouvez nous contacter via {ROUTE}."),
        ("es", UNVERIFIED["en"], f"You can reach us at {ROUTE}."),
        (None, UNVERIFIED["en"], f"You can reach us at {ROUTE}."),
    ],
)
async def test_a_question_the_sources_cannot_answer_points_to_the_contact_route(
    embedder: CountingEmbedder, language: str | None, message: str, contact: str
) -> None:
    result = await extractive_answer(
        "Do you sell gift cards?",
        [ABOUT, SHIPPING_EN, SHIPPING_NL],
        embedder,
        language=language,
        contact_route=ROUTE,
    )
    assert not result.answered
    assert result.citations == ()
    assert result.text == f"{message} {contact}"


async def test_without_a_contact_route_only_the_message_is_given(
    embedder: CountingEmbedder,
) -> None:
    result = await extractive_answer(
        "What is the capital of Peru?", [SHIPPING_EN], embedder, language="nl", contact_route=""
    )
    assert result.text == UNVERIFIED["nl"]
    assert not result.answered


async def test_no_sources_need_no_embedding(embedder: CountingEmbedder) -> None:
    result = await extractive_answer(
        "How long does shipping take?",
        [],
        embedder,
        language="de",
        contact_route="acme.example/contact.",
    )
    assert result.text == f"{UNVERIFIED['de']} Sie erreichen uns unter acme.example/contact."
    assert embedder.calls == []


async def test_the_similarity_floor_decides(embedder: CountingEmbedder) -> None:
    question = "How long does shipping to Belgium take?"
    strict = await extractive_answer(
        question, [SHIPPING_EN], embedder, language="en", contact_route="", min_similarity=0.95
    )
    assert not strict.answered


async def test_a_repeated_sentence_is_quoted_once(embedder: CountingEmbedder) -> None:
    sources = [
        "Orders to Belgium arrive within 2-3 working days.",
        "Orders to Belgium arrive within 2-3 working days!",
    ]
    result = await extractive_answer(
        "How long does shipping to Belgium take?",
        sources,
        embedder,
        language="en",
        contact_route="",
    )
    assert result.text == "Orders to Belgium arrive within 2-3 working days [1]."
    assert result.citations == (1,)


def test_markdown_is_split_into_quotable_sentences() -> None:
    assert split_sentences(
        [SHIPPING_EN, "Short one.\n\n1. Call us on +31 20 123 4567 any day"]
    ) == [
        Sentence(0, "We ship to the Netherlands, Belgium and Germany."),
        Sentence(0, "Orders placed before 15:00 on a working day ship the same day."),
        Sentence(0, "Orders to Belgium arrive within 2-3 working days."),
        Sentence(0, "Shipping is free for orders above €50, e.g. most shoe orders."),
        Sentence(0, "Country: Netherlands; Delivery time: 1-2 working days; Cost: €3.95"),
        Sentence(0, "Country: Belgium; Delivery time: 2-3 working days; Cost: €4.95"),
        Sentence(0, "You can return items within 30 days of delivery."),
        Sentence(0, "Returned items must be unused and in their original packaging."),
        Sentence(1, "Call us on +31 20 123 4567 any day"),
    ]
