"""The vectors of the quoted pieces, stored at ingest: a turn encodes only its question and
quotes what it quoted when it encoded every piece; older content still gets answered (and
stored on the way); an unchanged page is not embedded again."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import numpy as np
import pytest
from numpy.typing import NDArray

from core.answer.factory import build_pipeline
from core.answer.pipeline import AnswerPipeline, PipelineConfig
from core.cache import RedisCache
from core.knowledge.ingest import Ingestor, IngestReport, fill_piece_vectors
from core.knowledge.sources import parse_source
from core.retrieval.embedders import UseEmbedder
from core.settings import Settings
from core.store import Agents, Database
from core.store.knowledge import KnowledgeStore
from core.store.piece_vectors import PieceVectors
from core.store.vector_index import EmbedderIdentity
from core.turns import CollectingTurnOutput, TurnRequest

PAGES = {
    "en/shipping.md": """# Shipping

## Delivery times
Below you can see how long delivery takes to your country and what it costs.

| Country | Delivery time | Cost |
|---|---|---|
| Netherlands | 1-2 working days | €3.95 |
| Belgium | 2-3 working days | €4.95 |
| Germany | 3-4 working days | €6.95 |

## Free shipping
Orders above €50 ship free to the Netherlands and Belgium.
""",
    "en/returns.md": """# Returns

You can return any item within 30 days of delivery. Returned items must be unused.
Refunds arrive within 5 working days after we receive the parcel.

## How to return
- Print the return label from your account.
- Pack the item in its original box.
- Drop the parcel at any post office.
""",
    "en/payment.md": """# Payment methods

You can pay with iDEAL, Visa, Mastercard and PayPal. Klarna lets you pay within 30 days.
We never charge a fee for any payment method.
""",
    "en/store.md": """# Contact and store

## Store opening hours
| Day | Hours |
|---|---|
| Monday | 12:00-18:00 |
| Tuesday to Saturday | 10:00-18:00 |
| Sunday | closed |

## Address
Westblaak 142
3012 KM Rotterdam
""",
    "en/warranty.md": """# Warranty

All jackets carry a two-year warranty against manufacturing defects. Send a photo of the
defect to service@shop.example to make a claim. Shipping costs for a warranty repair are on us.
""",
    "en/boots.md": """# Fjord GTX boot

The Fjord GTX is a waterproof leather hiking boot for long days in wet country.

- Price: €189.95
- Colours: brown and blue
- Weight: 1.4 kg a pair

Delivery of the boots takes 2-3 working days in the Benelux.
""",
}
# Read from four pages: three whole, the fourth from the chunks that matched alone.
QUESTION = "How much does shipping cost and how do I pay?"


class CountingEmbedder:
    """The bundled encoder, keeping every text it is asked to encode; ``name`` may be set to
    stand for another embedder of the same size."""

    def __init__(self, inner: UseEmbedder, name: str | None = None) -> None:
        self.inner = inner
        self.name = name or inner.name
        self.dimension = inner.dimension
        self.texts: list[str] = []

    async def embed(self, texts: Sequence[str]) -> NDArray[np.float32]:
        self.texts.extend(texts)
        return await self.inner.embed(texts)


@dataclass
class Shop:
    database: Database
    settings: Settings
    cache: RedisCache
    use: UseEmbedder
    site: Path
    session: aiohttp.ClientSession

    def pipeline(self, embedder: CountingEmbedder, *, stored: bool = True) -> AnswerPipeline:
        return build_pipeline(
            self.settings,
            self.database.pool,
            self.cache,
            embedder,
            self.session,
            chat=None,
            config=PipelineConfig(pace_seconds=0.0, stored_pieces=stored),
        )

    async def ingest(self, embedder: CountingEmbedder | UseEmbedder) -> IngestReport:
        agent = await Agents(self.database.pool).get("shop")
        ingestor = Ingestor(KnowledgeStore(self.database.pool), embedder)
        return await ingestor.ingest(agent, parse_source(str(self.site)))

    async def pieces(self) -> int:
        count: int = await self.database.pool.fetchval("SELECT count(*) FROM piece_vectors")
        return count


async def ask(shop: Shop, pipeline: AnswerPipeline, key: str) -> dict[str, object]:
    """The done event of a turn asking QUESTION, with the pages its quote read ("read")."""
    output = CollectingTurnOutput()
    request = TurnRequest(agent="shop", channel="api", conversation_key=key, text=QUESTION)
    outcome = await pipeline.run(request, output)
    assert output.error is None
    assert output.done is not None
    await pipeline.memory.drain()
    trace = await shop.database.pool.fetchval(
        "SELECT trace FROM turns WHERE id = $1", outcome.turn_id
    )
    return {**output.done, "read": len(trace["sources"])}


@pytest.fixture
async def shop(
    settings: Settings,
    database: Database,
    use_embedder: UseEmbedder,
    cache: RedisCache,
    tmp_path: Path,
) -> AsyncIterator[Shop]:
    site = tmp_path / "site"
    for name, text in PAGES.items():
        (site / name).parent.mkdir(parents=True, exist_ok=True)
        (site / name).write_text(text, encoding="utf-8")
    agents = Agents(database.pool)
    await agents.create("shop", embedder=EmbedderIdentity.of(use_embedder))
    # every turn quotes: none may come from the answer cache
    await agents.update(
        "shop", contact_route="hello@shop.example", settings={"answer_cache": False}
    )
    async with aiohttp.ClientSession() as session:
        shop = Shop(database, settings, cache, use_embedder, site, session)
        await shop.ingest(use_embedder)
        yield shop


def _pieces_encoded(embedder: CountingEmbedder, question: str = QUESTION) -> list[str]:
    return [text for text in embedder.texts if text != question]


async def test_a_turn_encodes_only_its_question_and_quotes_as_when_it_encoded_every_piece(
    shop: Shop,
) -> None:
    computing = CountingEmbedder(shop.use)
    before = await ask(shop, shop.pipeline(computing, stored=False), "computed")
    assert before["read"] == 4  # three pages whole, one from its matching chunks alone
    assert len(_pieces_encoded(computing)) > 15

    reading = CountingEmbedder(shop.use)
    stored = await ask(shop, shop.pipeline(reading), "stored")
    assert set(reading.texts) == {QUESTION}
    assert "€3.95" in str(stored["answer"])
    assert stored["answer"] == before["answer"]
    assert stored["citations"] == before["citations"]
    assert stored["confidence"] == pytest.approx(before["confidence"], abs=0.01)


async def test_pages_indexed_before_pieces_were_stored_are_answered_and_stored_on_the_way(
    shop: Shop,
) -> None:
    expected = await ask(shop, shop.pipeline(CountingEmbedder(shop.use)), "first")
    await shop.database.pool.execute("DELETE FROM piece_vectors")  # content of an older Parley

    first = CountingEmbedder(shop.use)
    answered = await ask(shop, shop.pipeline(first), "old-1")
    assert answered["answer"] == expected["answer"]
    assert len(_pieces_encoded(first)) > 15
    assert await shop.pieces() > 0

    second = CountingEmbedder(shop.use)
    again = await ask(shop, shop.pipeline(second), "old-2")
    assert again["answer"] == expected["answer"]
    assert set(second.texts) == {QUESTION}


async def test_rebuilding_fills_in_the_pieces_of_older_content(shop: Shop) -> None:
    await shop.database.pool.execute("DELETE FROM piece_vectors")
    agent = await Agents(shop.database.pool).get("shop")
    filled = await fill_piece_vectors(
        KnowledgeStore(shop.database.pool), PieceVectors(shop.database.pool), shop.use, agent.id
    )
    assert filled > 15
    counting = CountingEmbedder(shop.use)
    answered = await ask(shop, shop.pipeline(counting), "filled")
    assert "€3.95" in str(answered["answer"])
    assert set(counting.texts) == {QUESTION}


async def test_another_embedders_vectors_are_never_used(shop: Shop) -> None:
    expected = await ask(shop, shop.pipeline(CountingEmbedder(shop.use)), "first")
    other = CountingEmbedder(shop.use, name="use:another-model")
    answered = await ask(shop, shop.pipeline(other), "other")
    assert answered["answer"] == expected["answer"]
    assert len(_pieces_encoded(other)) > 15  # the stored ones are the configured embedder's
    names = await shop.database.pool.fetch("SELECT DISTINCT embedder FROM piece_vectors")
    assert "use:another-model" in {r["embedder"] for r in names}


async def test_reingesting_unchanged_pages_embeds_nothing(shop: Shop) -> None:
    counting = CountingEmbedder(shop.use)
    again = await shop.ingest(counting)
    assert (again.added, again.updated, again.unchanged) == (0, 0, len(PAGES))
    assert counting.texts == []


async def test_a_changed_page_embeds_only_what_changed(shop: Shop) -> None:
    pieces = await shop.pieces()
    page = shop.site / "en/returns.md"
    page.write_text(PAGES["en/returns.md"].replace("30 days", "60 days"), encoding="utf-8")
    counting = CountingEmbedder(shop.use)
    changed = await shop.ingest(counting)
    assert (changed.updated, changed.unchanged) == (1, len(PAGES) - 1)
    # the page's chunks (heading path, a new line, their text, and the heading path alone)
    # and of its pieces only those that changed: the sentence with its heading, as the page
    # is read whole, and without
    headings = {r["heading"] for r in await shop.database.pool.fetch("SELECT heading FROM chunks")}
    embedded = [t for t in counting.texts if "\n" not in t and t not in headings]
    assert len(embedded) == changed.pieces_embedded == 2
    assert all("60 days" in t for t in embedded)
    assert await shop.pieces() == pieces  # one sentence's vectors replaced, the rest kept
