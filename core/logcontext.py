"""Ids bound to the work in progress (request, conversation), added to every log record."""

from __future__ import annotations

import logging
from contextvars import ContextVar

request_id: ContextVar[str] = ContextVar("request_id", default="-")
conversation_id: ContextVar[str] = ContextVar("conversation_id", default="-")


class ContextFilter(logging.Filter):
    """Copies the bound ids onto each record so formatters can print them."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.request_id = request_id.get()
        record.conversation_id = conversation_id.get()
        return True


def configure_logging(level: str = "INFO") -> None:
    """Event-style lines on stderr: time, level, logger, event, then the bound ids."""
    handler = logging.StreamHandler()
    handler.addFilter(ContextFilter())
    handler.setFormatter(
        logging.Formatter(
            "%(asctime)s %(levelname)s %(name)s %(message)s "
            "request_id=%(request_id)s conversation_id=%(conversation_id)s"
        )
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    # Library chatter that would otherwise drown ours, and could carry payloads at DEBUG.
    for noisy in (
        "asyncio",
        "httpx",
        "httpcore",
        "openai",
        "twilio",
        "telegram",
        "apscheduler",
        "pgserver",
    ):
        logging.getLogger(noisy).setLevel(max(logging.WARNING, logging.getLevelName(level)))
