"""What a channel hands to the answer pipeline, and what comes back: requests and events."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal, Protocol

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

# A channel's name: "web", "api", "playground", "test", or a messaging channel's as its
# registry names it ("whatsapp", "telegram", "meta"); stored with the conversation.
Channel = Annotated[str, Field(pattern=r"^[a-z][a-z0-9_]{0,31}$")]
EventKind = Literal["status", "token", "sources", "related", "done", "error"]

MAX_MESSAGE_CHARS = 4000

# A tag of pages and sources: a word, or words joined by "-", "_", ".", "/" or ":"
# ("pricing", "support/returns", "lang:nl"); stored lower-case.
TAG_PATTERN = r"^\w[\w:/.-]{0,63}$"
TagName = Annotated[str, Field(pattern=TAG_PATTERN)]

# C0 control characters but tab, newline and carriage return. PostgreSQL cannot store NUL in
# text or jsonb at all (a visitor's "\u0000" would fail the turn half-way through its
# stream), and none of the others means anything in a chat message.
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f]")


def clean_text(text: str) -> str:
    """``text`` without the control characters a message can neither carry nor be stored with."""
    return _CONTROL.sub("", text)


def clean_payload(value: Any) -> Any:
    """A provider's parsed JSON or form payload with `clean_text` applied to every string in
    it, keys included, so it can be stored as jsonb."""
    if isinstance(value, str):
        return clean_text(value)
    if isinstance(value, Mapping):
        return {clean_text(str(k)): clean_payload(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [clean_payload(v) for v in value]
    return value


def _clean_if_text(value: object) -> object:
    return clean_text(value) if isinstance(value, str) else value


# A string from a visitor or a provider, cleaned before it is validated (and stripped), so a
# message of nothing but control characters is refused as empty.
CleanText = Annotated[str, BeforeValidator(_clean_if_text)]


class PageContext(BaseModel):
    """The page the visitor is on, as the widget saw it."""

    model_config = ConfigDict(frozen=True, extra="ignore", str_strip_whitespace=True)

    url: CleanText | None = Field(None, max_length=2048)
    title: CleanText | None = Field(None, max_length=300)
    context: CleanText | None = Field(None, max_length=6000)


class TurnRequest(BaseModel):
    """One visitor message to answer, from any channel."""

    model_config = ConfigDict(frozen=True, extra="forbid", str_strip_whitespace=True)

    agent: str  # the agent's slug
    channel: Channel
    conversation_key: CleanText = Field(min_length=1, max_length=200)
    text: CleanText = Field(min_length=1, max_length=MAX_MESSAGE_CHARS)
    provider_message_id: CleanText | None = None
    page: PageContext | None = None
    language: CleanText | None = Field(None, max_length=16)  # reply-language hint
    overrides: Mapping[str, Any] | None = None  # playground only
    already_saved: bool = False  # the visitor's message is stored already (durable channels)
    writing_rule: str | None = None  # the channel's formatting rule, last in the prompt
    # Voice notes the text was transcribed from: {"media": link, "transcript": words}.
    voice: tuple[Mapping[str, str], ...] = ()
    # Only pages with one of these tags answer (none: any page), never pages with one of
    # ``exclude_tags``; added to the agent's own filters (settings "include_tags", ...).
    include_tags: tuple[TagName, ...] = ()
    exclude_tags: tuple[TagName, ...] = ()
    # The conversation so far as the caller keeps it ("visitor" / "assistant", oldest
    # first): used instead of the stored memory when given (the knowledge-query contract).
    previous_messages: tuple[tuple[Literal["visitor", "assistant"], CleanText], ...] | None = None
    max_results: int | None = Field(default=None, ge=1, le=20)  # sources to answer from
    # The network address the visitor's own browser sent from, where the channel sees it
    # (the widget; not a provider's or an API client's server): the visitor's day quota
    # counts it as well as the conversation, whose key the visitor may change at will.
    client_address: CleanText | None = Field(default=None, max_length=64)


@dataclass(frozen=True, slots=True)
class TurnEvent:
    """One event of a turn; every channel sees the same kinds in the same order:
    status*, token*, sources, related (pages to read on, when there are any), then done or
    error."""

    kind: EventKind
    data: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def status(
        cls, step: Literal["searching", "reading", "answering"], *, page: str | None = None
    ) -> TurnEvent:
        """``page``: the title of the page being read, when one is ("Reading Shipping…")."""
        return cls("status", {"step": step, "page": page} if page else {"step": step})

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

    @property
    def related(self) -> list[Mapping[str, Any]]:
        """The pages offered to read on (``{"title", "url"}``); empty when none were."""
        event = next((e for e in self.events if e.kind == "related"), None)
        return list(event.data["related"]) if event else []
