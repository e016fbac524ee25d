"""What a channel hands to the answer pipeline, and what comes back: requests and events."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field

Channel = Literal["web", "api", "whatsapp", "telegram", "playground", "test"]
EventKind = Literal["status", "token", "sources", "done", "error"]

MAX_MESSAGE_CHARS = 4000


class PageContext(BaseModel):
    """The page the visitor is on, as the widget saw it."""

    model_config = ConfigDict(frozen=True, extra="ignore", str_strip_whitespace=True)

    url: str | None = Field(None, max_length=2048)
    title: str | None = Field(None, max_length=300)
    context: str | None = Field(None, max_length=6000)


class TurnRequest(BaseModel):
    """One visitor message to answer, from any channel."""

    model_config = ConfigDict(frozen=True, extra="forbid", str_strip_whitespace=True)

    agent: str  # the agent's slug
    channel: Channel
    conversation_key: str = Field(min_length=1, max_length=200)
    text: str = Field(min_length=1, max_length=MAX_MESSAGE_CHARS)
    provider_message_id: str | None = None
    page: PageContext | None = None
    language: str | None = Field(None, max_length=16)  # reply-language hint
    overrides: Mapping[str, Any] | None = None  # playground only
    already_saved: bool = False  # the visitor's message is stored already (durable channels)
    writing_rule: str | None = None  # the channel's formatting rule, last in the prompt


@dataclass(frozen=True, slots=True)
class TurnEvent:
    """One event of a turn; every channel sees the same kinds in the same order:
    status*, token*, sources, then done or error."""

    kind: EventKind
    data: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def status(cls, step: Literal["searching", "reading", "answering"]) -> TurnEvent:
        return cls("status", {"step": step})

    @classmethod
    def token(cls, text: str) -> TurnEvent:
        return cls("token", {"text": text})

    @classmethod
    def error(cls, code: str, message: str) -> TurnEvent:
        return cls("error", {"code": code, "message": message})


class TurnOutput(Protocol):
    """Where a turn's events go: an SSE stream, or a collector for channels that send later."""

    async def emit(self, event: TurnEvent) -> None:
        """Deliver one event; raises `ConnectionResetError` when the client has gone."""
        ...


@dataclass
class CollectingTurnOutput:
    """Keeps every event; the JSON API, messaging channels and tests read the result."""

    events: list[TurnEvent] = field(default_factory=list)

    async def emit(self, event: TurnEvent) -> None:
        self.events.append(event)

    @property
    def done(self) -> Mapping[str, Any] | None:
        return next((e.data for e in self.events if e.kind == "done"), None)

    @property
    def error(self) -> Mapping[str, Any] | None:
        return next((e.data for e in self.events if e.kind == "error"), None)

    @property
    def streamed_text(self) -> str:
        return "".join(str(e.data["text"]) for e in self.events if e.kind == "token")

    @property
    def sources(self) -> list[Mapping[str, Any]]:
        event = next((e for e in self.events if e.kind == "sources"), None)
        return list(event.data["sources"]) if event else []
