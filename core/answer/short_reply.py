"""One short reply of a small model (a search query, a translation): asked without holding a
work slot, within a deadline; a failure is a reason to fall back, never the turn's error."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from core.errors import Unavailable
from core.ports import ChatMessage, ChatModel
from core.slots import network_wait

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ShortReply:
    text: str  # one line, quotes around it dropped; "" when it failed
    failure: str | None = None  # why there is none: "timeout", "error" or "empty"


async def short_reply(
    chat: ChatModel,
    messages: Sequence[ChatMessage],
    *,
    model: str | None,
    timeout: float,  # noqa: ASYNC109 - the model request's own deadline
    max_tokens: int,
    what: str,
    tidy: Callable[[str], str] = lambda text: text,
) -> ShortReply:
    """The model's reply to ``messages``, ``tidy``-ed, on one line; ``what`` names it in the
    log when the model fails."""
    try:
        async with network_wait():  # the model's wait costs the turn no work slot
            reply = await chat.complete(
                messages, max_tokens=max_tokens, temperature=0.0, model=model, timeout=timeout
            )
    except Unavailable as exc:
        reason = "timeout" if "timeout" in exc.message.lower() else "error"
        log.info("%s.fallback reason=%s", what, reason)
        return ShortReply("", reason)
    text = " ".join(tidy(reply).strip().strip('"').split())
    return ShortReply(text, None if text else "empty")
