"""The one value a messaging channel hands over: an inbound message, normalised.

A channel (`channels/`) verifies a webhook and parses the provider's payload into an
`InboundMessage`; the inbox stores it beside the raw payload (kept for staff), and nothing
past the channel reads a provider's payload again.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

MediaKind = Literal["audio", "image", "video", "document", "sticker", "other"]
MEDIA_KINDS: tuple[MediaKind, ...] = ("audio", "image", "video", "document", "sticker", "other")


@dataclass(frozen=True, slots=True)
class MediaItem:
    """One attachment: ``ref`` is what the channel fetches it by (a URL, a media or file id)."""

    kind: MediaKind
    ref: str
    mime_type: str | None = None


@dataclass(frozen=True, slots=True)
class InboundMessage:
    """A customer's message as every channel gives it.

    ``customer_id`` is the conversation key (the WhatsApp number, the Telegram chat id);
    ``text`` is what they typed, or the caption of their media ('' for neither);
    ``command`` is a channel command the bot answers with a fixed reply (``start``).
    """

    customer_id: str
    provider_message_id: str
    text: str = ""
    display_name: str | None = None
    handle: str | None = None
    language_hint: str | None = None
    media: tuple[MediaItem, ...] = ()
    command: str | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["media"] = [asdict(item) for item in self.media]
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
            extra=dict(data.get("extra") or {}),
        )

    @property
    def voice(self) -> MediaItem | None:
        return next((m for m in self.media if m.kind == "audio"), None)
