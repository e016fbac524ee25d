"""The one value a messaging channel hands over: an inbound message, normalised.

A channel (`channels/`) verifies a webhook and parses the provider's payload into an
`InboundMessage`; the inbox stores it beside the raw payload (kept for staff), and nothing
past the channel reads a provider's payload again.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any, Literal

MediaKind = Literal["audio", "image", "video", "document", "sticker", "other"]
MEDIA_KINDS: tuple[MediaKind, ...] = ("audio", "image", "video", "document", "sticker", "other")


@dataclass(frozen=True, slots=True)
class MediaItem:
    """One attachment: ``ref`` is what the channel fetches it by (a URL, a media or file id)."""

    kind: MediaKind
    ref: str
    mime_type: str | None = None


Rating = Literal["up", "down"]
# What a feedback button sends back: its turn and rating, well within the 64 bytes Telegram
# allows a button's data (``fb:`` and a bigint are at most 27 characters).
_FEEDBACK_DATA = re.compile(r"fb:([1-9][0-9]{0,18}):(up|down)")
_MAX_ID = 2**63 - 1


@dataclass(frozen=True, slots=True)
class FeedbackAnswer:
    """A customer's rating of one answer, given by pressing a button under "Did this answer
    your question?" (`core.delivery.Choice`). ``receipt`` is the channel's id of the press,
    by which it is acknowledged (Telegram's callback query id).

    Only the customer's conversation vouches for it: the turn named here is rated only when
    it belongs to the conversation the press came from (`core.store.feedback.Feedback`).
    """

    turn_id: int
    rating: Rating
    receipt: str | None = None

    @property
    def data(self) -> str:
        """What the button sends back when pressed."""
        return f"fb:{self.turn_id}:{self.rating}"

    @classmethod
    def parse(cls, data: str, receipt: str | None = None) -> FeedbackAnswer | None:
        """The answer a button's ``data`` stands for; None when it is not one of ours."""
        found = _FEEDBACK_DATA.fullmatch(data)
        if found is None or int(found[1]) > _MAX_ID:
            return None
        rating: Rating = "up" if found[2] == "up" else "down"
        return cls(int(found[1]), rating, receipt)

    @classmethod
    def from_json(cls, data: Any) -> FeedbackAnswer | None:
        if not isinstance(data, Mapping):
            return None
        turn_id, rating, receipt = data.get("turn_id"), data.get("rating"), data.get("receipt")
        if type(turn_id) is not int or rating not in ("up", "down"):
            return None
        return cls(turn_id, "up" if rating == "up" else "down", str(receipt) if receipt else None)


@dataclass(frozen=True, slots=True)
class InboundMessage:
    """A customer's message as every channel gives it.

    ``customer_id`` is the conversation key (the WhatsApp number, the Telegram chat id);
    ``text`` is what they typed, or the caption of their media ('' for neither);
    ``command`` is a channel command the bot answers with a fixed reply (``start``);
    ``feedback`` is a press of a feedback button (no text then).
    """

    customer_id: str
    provider_message_id: str
    text: str = ""
    display_name: str | None = None
    handle: str | None = None
    language_hint: str | None = None
    media: tuple[MediaItem, ...] = ()
    command: str | None = None
    feedback: FeedbackAnswer | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        # Field by field rather than `asdict`, which deep-copies: this runs for every webhook.
        data = {name: getattr(self, name) for name in _MESSAGE_FIELDS}
        data["media"] = [
            {"kind": item.kind, "ref": item.ref, "mime_type": item.mime_type} for item in self.media
        ]
        feedback = self.feedback
        if feedback is not None:
            data["feedback"] = {
                "turn_id": feedback.turn_id,
                "rating": feedback.rating,
                "receipt": feedback.receipt,
            }
        data["extra"] = dict(self.extra)
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> InboundMessage:
        media = tuple(
            MediaItem(
                kind=item["kind"] if item.get("kind") in MEDIA_KINDS else "other",
                ref=str(item.get("ref") or ""),
                mime_type=item.get("mime_type"),
            )
            for item in data.get("media") or ()
            if isinstance(item, Mapping)
        )
        return cls(
            customer_id=str(data.get("customer_id") or ""),
            provider_message_id=str(data.get("provider_message_id") or ""),
            text=str(data.get("text") or ""),
            display_name=data.get("display_name"),
            handle=data.get("handle"),
            language_hint=data.get("language_hint"),
            media=media,
            command=data.get("command"),
            feedback=FeedbackAnswer.from_json(data.get("feedback")),
            extra=dict(data.get("extra") or {}),
        )

    @property
    def voice(self) -> MediaItem | None:
        return next((m for m in self.media if m.kind == "audio"), None)


_MESSAGE_FIELDS = tuple(f.name for f in fields(InboundMessage))
