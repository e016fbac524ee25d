"""Which failed turns the inbox worker tries again, and for how long."""

from __future__ import annotations

import asyncpg
import pydantic
import pytest
import redis.exceptions

from core.errors import (
    AgentNotFound,
    CacheUnavailable,
    InvalidInput,
    ModelFailed,
    StoreUnavailable,
    Unavailable,
)
from core.jobs.inbox_worker import failure_kind
from core.turns import TurnRequest


def _invalid_request() -> pydantic.ValidationError:
    try:
        TurnRequest(agent="shop", channel="whatsapp", conversation_key="x" * 300, text="hi")
    except pydantic.ValidationError as exc:
        return exc
    raise AssertionError("the request was accepted")


@pytest.mark.parametrize(
    "error",
    [
        Unavailable("language model failed: status 500"),
        ModelFailed("language model failed: status 429"),
        StoreUnavailable("database is unreachable"),
        CacheUnavailable("redis is unreachable"),
        TimeoutError(),
        ConnectionRefusedError(),
        asyncpg.exceptions.ConnectionDoesNotExistError("connection was closed"),
        asyncpg.exceptions.CannotConnectNowError("the database system is starting up"),
        asyncpg.exceptions.AdminShutdownError("terminating connection"),
        asyncpg.exceptions.TooManyConnectionsError("too many clients"),
        asyncpg.exceptions.DeadlockDetectedError("deadlock detected"),
        redis.exceptions.ConnectionError("connection refused"),
    ],
    ids=lambda e: type(e).__name__,
)
def test_a_service_that_is_down_is_waited_for(error: Exception) -> None:
    assert failure_kind(error) == "transient"


@pytest.mark.parametrize(
    "error",
    [
        _invalid_request(),
        InvalidInput("bad"),
        AgentNotFound("gone"),
        ModelFailed("language model failed: status 401", transient=False),
    ],
    ids=lambda e: type(e).__name__,
)
def test_a_message_that_can_never_be_answered_ends(error: Exception) -> None:
    assert failure_kind(error) == "permanent"


def test_anything_else_is_tried_a_few_times() -> None:
    assert failure_kind(RuntimeError("bug")) == "unexpected"
    assert failure_kind(KeyError("missing")) == "unexpected"
