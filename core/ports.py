"""The interfaces core depends on, implemented by adapters chosen at start-up."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

import numpy as np
from numpy.typing import NDArray


@dataclass(frozen=True, slots=True)
class BucketResult:
    """The outcome of taking from a token bucket."""

    allowed: bool
    remaining: float
    retry_after: float  # seconds until the request would be allowed; 0 when allowed


class Cache(Protocol):
    """Short-lived shared state: everything here may vanish and be rebuilt from Postgres.

    Values are strings; TTLs are seconds (fractions allowed). Every implementation gives the
    same answers for the same calls, so the in-process cache can stand in for Redis.

    The cache the processes use never fails a call (`core.cache.FallbackCache`): while Redis
    is down, reads miss, writes are skipped and report False, and token buckets are kept in
    the process. So nothing may rely on it for correctness: deduplication and locks belong
    in PostgreSQL, never in a ``set(..., only_if_absent=True)`` here.
    """

    kind: str  # "redis" or "local", for readiness reports

    async def get(self, key: str) -> str | None: ...

    async def set(
        self, key: str, value: str, ttl: float | None = None, *, only_if_absent: bool = False
    ) -> bool:
        """Store ``value``; with ``only_if_absent`` do nothing (and return False) if set."""
        ...

    async def delete(self, *keys: str) -> int:
        """Remove the keys; returns how many existed."""
        ...

    async def incr(self, key: str, amount: int = 1, ttl: float | None = None) -> int:
        """Add ``amount`` and return the new value; ``ttl`` applies when the key is created."""
        ...

    async def take_token(
        self, key: str, *, rate: float, capacity: float, cost: float = 1.0
    ) -> BucketResult:
        """Token bucket refilled at ``rate`` tokens a second up to ``capacity``."""
        ...

    async def list_push(self, key: str, *values: str, keep: int, ttl: float | None) -> None:
        """Append values, keep only the newest ``keep`` items and (re)set the TTL."""
        ...

    async def list_range(self, key: str) -> list[str]:
        """All items of a list, oldest first; empty when the key has gone."""
        ...

    async def ping(self) -> None:
        """Raise `CacheUnavailable` when the cache cannot answer (only this call raises it)."""
        ...

    async def close(self) -> None: ...


class Embedder(Protocol):
    """Turns texts into L2-normalised vectors; ``name`` and ``dimension`` identify the index."""

    @property
    def name(self) -> str: ...

    @property
    def dimension(self) -> int: ...

    async def embed(self, texts: Sequence[str]) -> NDArray[np.float32]:
        """One row per text, in order, shape (len(texts), dimension)."""
        ...


class Reranker(Protocol):
    """Scores (query, text) pairs; higher is more relevant, roughly in [0, 1]."""

    async def rerank(self, query: str, texts: Sequence[str]) -> list[float]: ...


@dataclass(frozen=True, slots=True)
class ToolCall:
    """A tool the model asks to be called: ``arguments`` is its JSON text as the model wrote
    it (which may not parse)."""

    id: str
    name: str
    arguments: str


@dataclass(frozen=True, slots=True)
class Tool:
    """A tool offered to the model: ``parameters`` is the JSON schema of its arguments."""

    name: str
    description: str
    parameters: Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class ChatMessage:
    """One message of a chat. An assistant message may ask for ``tool_calls``; each is
    answered by a "tool" message carrying the call's id in ``tool_call_id``."""

    role: Literal["system", "user", "assistant", "tool"]
    content: str
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str | None = None


@dataclass(frozen=True, slots=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int


@dataclass(frozen=True, slots=True)
class ChatReply:
    """A whole assistant message: text, tool calls, or both."""

    text: str
    tool_calls: tuple[ToolCall, ...] = ()
    usage: Usage | None = None


@dataclass(frozen=True, slots=True)
class ChatChunk:
    """A piece of a streamed reply: text, or (last) the token usage and how long the model
    thought before and while it wrote (reasoning models; None for others)."""

    text: str = ""
    usage: Usage | None = None
    thought_seconds: float | None = None


class ChatModel(Protocol):
    """An LLM that streams replies; failures raise `core.errors.Unavailable`, preferably its
    `ModelFailed`, which says whether trying again later may work."""

    @property
    def model(self) -> str: ...

    def stream(
        self,
        messages: Sequence[ChatMessage],
        *,
        max_tokens: int,
        temperature: float,
        model: str | None = None,
    ) -> AsyncIterator[ChatChunk]:
        """Reply token by token; ``model`` overrides the default (e.g. the rewrite model)."""
        ...

    async def complete(
        self,
        messages: Sequence[ChatMessage],
        *,
        max_tokens: int,
        temperature: float,
        model: str | None = None,
        timeout: float | None = None,  # noqa: ASYNC109 - the HTTP request's own timeout
    ) -> str:
        """The whole reply at once (rewrites, summaries)."""
        ...

    async def respond(
        self,
        messages: Sequence[ChatMessage],
        *,
        tools: Sequence[Tool],
        max_tokens: int,
        temperature: float,
        tool_choice: Literal["auto", "none"] = "auto",
        model: str | None = None,
        timeout: float | None = None,  # noqa: ASYNC109 - the HTTP request's own timeout
    ) -> ChatReply:
        """One assistant message at once, which may ask for some of ``tools`` to be called
        (``tool_choice="none"``: it may not). `core.errors.ToolsUnsupported` (a `ModelFailed`)
        when the server, or the model there, takes no tools."""
        ...


class Transcriber(Protocol):
    """Speech to text (voice notes); failures raise `core.errors.ModelFailed`, which says
    whether trying again later may work."""

    @property
    def model(self) -> str: ...

    async def transcribe(
        self, audio: bytes, *, content_type: str, filename: str | None = None
    ) -> str:
        """The words spoken in ``audio`` (e.g. ``audio/ogg``), stripped; empty when none.
        Without ``filename`` one is made from ``content_type`` (the API reads the format from
        the file name's extension)."""
        ...

    async def close(self) -> None: ...
