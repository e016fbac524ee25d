"""The data of each server-sent event the gateway streams, as the OpenAPI document shows it.

Each event is ``event: <name>`` and ``data: <JSON>``; these models are that JSON, per name.
Fields are described as sent; a client should ignore fields it does not know.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, Field

from gateway.admin.schemas import Out, TurnTraceOut

Events = tuple[tuple[str, type[BaseModel]], ...]


# -- a turn: the widget's chat and the playground --------------------------------------------


class StatusData(Out):
    step: Literal["searching", "reading", "answering"]


class TokenData(Out):
    text: str = Field(description="the next piece of the answer")


class SourceData(Out):
    id: int = Field(description="the number the answer cites it by, as [1]")
    url: str
    title: str
    score: float


class SourcesData(Out):
    sources: list[SourceData] = Field(description="the sources shown with the answer")


class RelatedPageData(Out):
    title: str
    url: str


class RelatedData(Out):
    related: list[RelatedPageData] = Field(
        description="up to three pages to read on that the answer did not show as sources"
    )


class DoneData(Out):
    conversation_id: int
    turn_id: int
    confidence: float | None
    low_confidence: bool
    citations: list[int] = Field(description="the numbers of the sources the answer cites")
    answer: str = Field(description="the whole answer, as the tokens built it")
    mode: str = Field(description="how it was answered: llm, extractive, curated, handoff...")
    deferred: bool = Field(False, description="the answer says it could not answer")
    handoff: Literal["waiting_for_staff", "staff"] | None = Field(
        None, description="staff have the conversation: the message waits for them"
    )


class ErrorData(Out):
    code: str = Field(description="llm_failed, rate_limited, ...")
    message: str


class DiagnosticsData(Out):
    session_id: str
    overrides: dict[str, Any]
    staff: str
    turn: TurnTraceOut | None = Field(description="the trace the turn was saved with")


TURN_EVENTS: Events = (
    ("status", StatusData),
    ("token", TokenData),
    ("sources", SourcesData),
    ("related", RelatedData),
    ("done", DoneData),
    ("error", ErrorData),
)
PLAYGROUND_EVENTS: Events = (*TURN_EVENTS, ("diagnostics", DiagnosticsData))


# -- a widget conversation, live -----------------------------------------------------------


class StateData(Out):
    status: Literal["bot", "waiting_for_staff", "staff"]


class StaffData(Out):
    id: int = Field(description="the message's id (also the event's id)")
    text: str
    created_at: datetime


class HandoffData(Out):
    id: int = Field(description="the message's id (also the event's id)")
    status: Literal["bot", "waiting_for_staff", "staff"]
    created_at: datetime


class TypingData(Out):
    staff: str = Field(description="who of the staff is writing (shown as typing)")


CONVERSATION_EVENTS: Events = (
    ("state", StateData),
    ("staff", StaffData),
    ("handoff", HandoffData),
    ("typing", TypingData),
)
