"""Both embedders for real: the bundled USE model, and the openai client against a local fake."""

from __future__ import annotations

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
