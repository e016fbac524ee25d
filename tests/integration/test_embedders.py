"""Both embedders for real: the bundled USE model, and the openai client against a local fake."""

from __future__ import annotations

import asyncio

import numpy as np
import openai
import pytest
from aiohttp.test_utils import TestServer

from core.errors import Unavailable
from core.retrieval.embedders import OpenAIEmbedder, UseEmbedder, open_embedder
from core.settings import Settings
from tests.fakes.openai import FakeOpenAI, fake_vector


async def test_use_vectors_are_normalised_and_cross_lingual(use_embedder: UseEmbedder) -> None:
    vectors = await use_embedder.embed(
        [
            "How long does shipping to Belgium take?",
            "Hoe lang duurt de verzending naar België?",
            "Wie lange dauert der Versand nach Belgien?",
            "What is the capital of Peru?",
        ]
    )
    assert vectors.shape == (4, 512)
    assert vectors.dtype == np.float32
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    similarity = vectors @ vectors.T
    assert similarity[0, 1] > 0.6  # Dutch lands near its English twin
    assert similarity[0, 2] > 0.6
    assert similarity[0, 3] < 0.35
    assert (await use_embedder.embed([])).shape == (0, 512)


async def test_a_question_is_not_kept_waiting_behind_pages_being_embedded(
    use_embedder: UseEmbedder,
) -> None:
    """A visitor's question goes before the rest of a page being indexed (or quoted)."""
    sentences = [
        f"Parcels to region {i} arrive within two to three working days." for i in range(300)
    ]
    pages = asyncio.create_task(use_embedder.embed(sentences))
    await asyncio.sleep(0)  # the pages are being embedded
    question = asyncio.create_task(use_embedder.embed(["How long does delivery to Belgium take?"]))
    done, _ = await asyncio.wait({pages, question}, return_when=asyncio.FIRST_COMPLETED)
    assert question in done
    assert not pages.done()
    vectors = await pages
    assert vectors.shape == (300, 512)
    alone = await use_embedder.embed(sentences[150:152])
    assert np.allclose(vectors[150:152], alone, atol=1e-5)  # the same vectors, sliced or not


async def test_questions_asked_at_once_get_their_own_vectors(use_embedder: UseEmbedder) -> None:
    questions = [
        "Where is my parcel?",
        "Wo ist mein Paket?",
        "Do you sell tents?",
        "Openingstijden?",
    ]
    vectors = await asyncio.gather(*(use_embedder.embed([q]) for q in questions))
    separately = [await use_embedder.embed([q, "filler"]) for q in questions]
    for vector, alone in zip(vectors, separately, strict=True):
        assert vector.shape == (1, 512)
        assert np.allclose(vector[0], alone[0], atol=1e-5)
    vectors[0][0, 0] = 7.0  # a caller's copy is its own
    assert (await use_embedder.embed([questions[0]]))[0, 0] != 7.0


@pytest.fixture
async def fake_openai() -> FakeOpenAI:
    return FakeOpenAI(dimension=48)


async def _server(fake: FakeOpenAI) -> TestServer:
    server = TestServer(fake.app())
    await server.start_server()
    return server


async def test_openai_embedder_batches_in_order(fake_openai: FakeOpenAI) -> None:
    server = await _server(fake_openai)
    client = openai.AsyncOpenAI(
        api_key="sk-test", base_url=str(server.make_url("/v1")), max_retries=0
    )
    embedder = OpenAIEmbedder(client, "text-embedding-3-small", 48, batch_size=3)
    texts = [f"text {i}" for i in range(7)]
    vectors = await embedder.embed(texts)
    await embedder.close()
    await server.close()
    assert vectors.shape == (7, 48)
    assert [len(r["body"]["input"]) for r in fake_openai.requests] == [3, 3, 1]
    assert fake_openai.requests[0]["auth"] == "Bearer sk-test"
    assert np.allclose(vectors[5], fake_vector("text 5", 48), atol=1e-6)


async def test_a_question_asked_again_or_meanwhile_costs_one_request(
    fake_openai: FakeOpenAI,
) -> None:
    """A turn asks for its question's vector several times (the answer cache, the search, the
    quote): the embedding service is asked once."""
    server = await _server(fake_openai)
    client = openai.AsyncOpenAI(api_key="k", base_url=str(server.make_url("/v1")), max_retries=0)
    embedder = OpenAIEmbedder(client, "m", 48)
    at_once = await asyncio.gather(*(embedder.embed(["Where is my parcel?"]) for _ in range(3)))
    again = await embedder.embed(["Where is my parcel?"])
    both = await embedder.embed(["Where is my parcel?", "Do you sell tents?"])
    await embedder.close()
    await server.close()
    inputs = [r["body"]["input"] for r in fake_openai.requests]
    assert inputs == [["Where is my parcel?"], ["Do you sell tents?"]]
    expected = fake_vector("Where is my parcel?", 48)
    assert all(np.allclose(v[0], expected, atol=1e-6) for v in [*at_once, again, both])
    assert np.allclose(both[1], fake_vector("Do you sell tents?", 48), atol=1e-6)


async def test_openai_embedder_retries_5xx_and_429_then_gives_up(fake_openai: FakeOpenAI) -> None:
    server = await _server(fake_openai)
    client = openai.AsyncOpenAI(api_key="k", base_url=str(server.make_url("/v1")), max_retries=0)
    embedder = OpenAIEmbedder(client, "m", 48, backoff=0.01)
    fake_openai.failures = [500, 429]
    vectors = await embedder.embed(["hello"])
    assert vectors.shape == (1, 48)
    assert len(fake_openai.requests) == 3
    fake_openai.failures = [503] * 10
    with pytest.raises(Unavailable, match="embedding service failed"):
        await embedder.embed(["again"])
    assert len(fake_openai.requests) == 3 + 5  # five attempts, then the error
    await embedder.close()
    await server.close()


async def test_an_unknown_model_is_asked_for_its_size(fake_openai: FakeOpenAI) -> None:
    server = await _server(fake_openai)
    settings = Settings(  # type: ignore[call-arg]
        _env_file=None,
        embed_provider="openai",
        embed_model="nomic-embed-text",
        embed_base_url=str(server.make_url("/v1")),
    )
    embedder = await open_embedder(settings)
    assert (embedder.name, embedder.dimension) == ("openai:nomic-embed-text", 48)
    assert isinstance(embedder, OpenAIEmbedder)
    await embedder.close()
    await server.close()
