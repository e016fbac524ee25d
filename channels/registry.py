"""The messaging channels this gateway speaks: one line each.

The gateway mounts their routes, the workers send with their senders and follow their
writing rules, the admin API, the console and OpenAPI list their credential fields, all by
looping over `CHANNELS`. A conversation's channel is stored by name and checked here.
The web widget and the JSON API are not messaging channels: they answer within the request.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from channels.base import Channel
from channels.meta import META
from channels.telegram import TELEGRAM
from channels.twilio import TWILIO

CHANNELS: tuple[Channel, ...] = (TWILIO, TELEGRAM, META)

BY_NAME: Mapping[str, Channel] = MappingProxyType({c.name: c for c in CHANNELS})

# Conversations that are not a messaging channel's: answered in the request itself.
DIRECT_CHANNELS = ("web", "api", "playground", "test")

# What staff call each channel: a messaging channel by its own title, then the others.
CHANNEL_TITLES: Mapping[str, str] = MappingProxyType(
    {
        **{c.name: c.title for c in CHANNELS},
        "web": "Website",
        "api": "API",
        "playground": "Playground",
        "test": "Answer check",
    }
)


def channel_names() -> tuple[str, ...]:
    """Every channel a conversation may be on, messaging channels first."""
    return (*BY_NAME, *DIRECT_CHANNELS)


def secret_fields() -> dict[str, tuple[str, ...]]:
    """Per settings block, the fields stored only sealed (`core.keyring`)."""
    return {c.block: tuple(f.name for f in c.credential_fields if f.secret) for c in CHANNELS}
