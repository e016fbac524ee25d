"""Exact lexical matches on real PostgreSQL: the exactness column and the ranking it earns."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from core.cache import LocalCache
from core.knowledge.ingest import Ingestor
from core.knowledge.sources import parse_source
from core.retrieval.embedders import UseEmbedder
from core.retrieval.fusion import EXACT_FROM
from core.retrieval.retriever import RetrievalQuery, Retriever
from core.store import Agent, Agents, Database
from core.store.knowledge import KnowledgeStore
from core.store.search import ChunkSearch, SearchFilters
from core.store.vector_index import EmbedderIdentity

# A small FAQ without language folders: Dutch entries and their English twins, questions
# that share most of their words, and one English-only page.
FAQ = [
    (
        "nl",
        "wijzigen",
        "Kan ik mijn bestelling wijzigen of annuleren?",
        "Ja, zolang je bestelling nog niet is ingepakt. Bel de klantenservice, want "
        "bestellingen worden vaak binnen een uur ingepakt.",
    ),
    (
        "nl",
        "afhaalpunt",
        "Kan ik mijn bestelling naar een afhaalpunt laten sturen?",
        "Ja. In Nederland en België kies je bij het afrekenen een PostNL-punt.",
    ),
    (
        "nl",
        "retour",
        "Beschadigd of verkeerd artikel ontvangen?",
        "Neem binnen 7 dagen na levering contact op met de klantenservice, het liefst met een "
        "foto. We sturen je een gratis retourlabel.",
    ),
    (
        "nl",
        "kortingen",
        "Krijg ik studentenkorting?",
        "Studenten krijgen 10% korting in onze winkel op vertoon van een geldige studentenkaart. "
        "Voor de garantie op jassen, zie de garantiepagina.",
    ),
    (
        "en",
        "change",
        "Can I change or cancel my order?",
        "Yes, as long as your order has not been packed yet. Call customer service, because "
        "orders are often packed within an hour.",
    ),
    (
        "en",
        "pick-up",
        "Can I have my order sent to a pick-up point?",
        "Yes. In the Netherlands and Belgium you can choose a PostNL pick-up point at checkout.",
    ),
    (
        "nl",
        "klarna",
        "Klarna: achteraf betalen of in drie termijnen",
        "Met Klarna ontvang je eerst je bestelling en betaal je binnen 30 dagen, of in drie "
        "renteloze termijnen vanaf 100 euro.",
    ),
    (
        "en",
        "klarna",
        "Klarna: pay later or in three instalments",
        "With Klarna you receive your order first and pay within 30 days, or in three "
        "interest-free instalments from 100 euros.",
    ),
    (
        "nl",
        "betaalproblemen",
        "Problemen met betalen",
        "Gaat er iets mis tijdens het betalen, dan blijft je bestelling 24 uur gereserveerd.",
    ),
    (
        "en",
        "payment-problems",
        "Payment problems",
        "If something goes wrong during payment, your order stays reserved for 24 hours.",
    ),
    (
        "en",
        "warranty",
        "Warranty",
        "All jackets carry a two-year warranty against manufacturing defects. Backpacks have a "
        "lifetime warranty. Send a photo of the defect to make a claim.",
    ),
]


def _url(lang: str, slug: str) -> str:
    return f"https://faq.example/{lang}-{slug}"


@pytest.fixture
async def agent(database: Database, use_embedder: UseEmbedder, tmp_path: Path) -> Agent:
    agents = Agents(database.pool)
    created = await agents.create("faq", embedder=EmbedderIdentity.of(use_embedder))
    path = tmp_path / "faq.jsonl"
    path.write_text(
        "\n".join(
            json.dumps({"url": _url(lang, slug), "title": title, "text": text, "lang": lang})
            for lang, slug, title, text in FAQ
        )
        + "\n",
        encoding="utf-8",
    )
    await Ingestor(KnowledgeStore(database.pool), use_embedder).ingest(
        created, parse_source(str(path))
    )
    return await agents.get("faq")


async def _exactness(
    database: Database, use_embedder: UseEmbedder, agent: Agent, text: str, language: str
) -> dict[str, float]:
    vector = (await use_embedder.embed([text]))[0]
    rows = await ChunkSearch(database.pool).lexical(
        agent.id, use_embedder.dimension, vector, text, language, 20, SearchFilters()
    )
    return {c.url: c.exactness for c in rows}


async def test_a_title_typed_word_for_word_is_exact_and_a_shared_word_is_not(
    database: Database, use_embedder: UseEmbedder, agent: Agent
) -> None:
    scores = await _exactness(
        database, use_embedder, agent, "Kan ik mijn bestelling wijzigen of annuleren?", "nl"
    )
    assert scores[_url("nl", "wijzigen")] == pytest.approx(1.0)
    # "bestelling" alone, in a question that is otherwise different, is no exact match.
    assert scores[_url("nl", "afhaalpunt")] < EXACT_FROM


async def test_a_sentence_of_the_text_counts_as_well_as_a_heading(
    database: Database, use_embedder: UseEmbedder, agent: Agent
) -> None:
    scores = await _exactness(
        database, use_embedder, agent, "Backpacks have a lifetime warranty", "en"
    )
    assert scores[_url("en", "warranty")] == pytest.approx(1.0)


async def test_nearly_word_for_word_is_near_exact(
    database: Database, use_embedder: UseEmbedder, agent: Agent
) -> None:
    # One word left out of a five-word question.
    scores = await _exactness(
        database, use_embedder, agent, "Kan ik mijn bestelling wijzigen?", "nl"
    )
    assert EXACT_FROM <= scores[_url("nl", "wijzigen")] < 1.0


async def _first(retriever: Retriever, agent: Agent, text: str, language: str) -> str:
    result = await retriever.retrieve(
        RetrievalQuery(agent=agent, text=text, k=5, reply_language=language)
    )
    return result.pages(ranked=True)[0].url


async def test_every_faq_title_retrieves_its_own_entry_first(
    database: Database, use_embedder: UseEmbedder, agent: Agent
) -> None:
    retriever = Retriever(ChunkSearch(database.pool), use_embedder, LocalCache())
    for lang, slug, title, _ in FAQ:
        assert await _first(retriever, agent, title, lang) == _url(lang, slug), title


async def test_a_dutch_question_answered_only_in_english_still_finds_the_english_page(
    database: Database, use_embedder: UseEmbedder, agent: Agent
) -> None:
    # Dutch entries share "garantie" and "jassen" with the question, by accident.
    retriever = Retriever(ChunkSearch(database.pool), use_embedder, LocalCache())
    first = await _first(retriever, agent, "Hoe lang is de garantie op een rugzak?", "nl")
    assert first == _url("en", "warranty")
