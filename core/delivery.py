"""The delivery contract between core and the messaging channels.

Core queues replies (`core.jobs.inbox_worker`, staff replies) and sends them
(`core.jobs.outbox_sender`); a channel (`channels/`) implements these protocols for its
provider. A reply is cut into parts once, by its channel's `ChannelRules.reply_parts`, when
it is queued; a `Sender` sends one part at a time and never splits again.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol, runtime_checkable


@dataclass(frozen=True, slots=True)
class Sent:
    """One part the provider accepted, with the id it gave it (Twilio `SM...`, Telegram id,
    Meta `wamid...`). ``status`` is the provider's delivery status when known (a look-up)."""

    provider_message_id: str
    status: str | None = None


class DeliveryError(Exception):
    """A part was not accepted by the provider.

    ``permanent`` errors must not be retried (invalid number, blocked bot, outside WhatsApp's
    24-hour window); transient ones may be, not before ``retry_after`` seconds when given.
    ``code`` is the provider's error code when it has one (Twilio ``21617``), else a short
    slug (``timeout``, ``forbidden``).

    ``ambiguous`` says the request may have reached the provider and been accepted, only its
    answer never arrived (a timeout after the request went out, a connection dropped while
    waiting). Before such a part is sent again, a provider that can be asked (Twilio) is asked
    whether it has it. An error the provider answered with, or a connection that was never
    made, is not ambiguous: nothing was accepted.
    """

    def __init__(
        self,
        message: str,
        *,
        code: str | None = None,
        permanent: bool = False,
        retry_after: float | None = None,
        ambiguous: bool = False,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.permanent = permanent
        self.retry_after = retry_after
        self.ambiguous = ambiguous

    def __repr__(self) -> str:
        return (
            f"DeliveryError({self.message!r}, code={self.code!r}, permanent={self.permanent}, "
            f"retry_after={self.retry_after!r}, ambiguous={self.ambiguous})"
        )


def too_long(text: str, limit: int) -> DeliveryError:
    """The error for a part above the channel's limit: a bug upstream, never retried."""
    return DeliveryError(
        f"a part of {len(text)} characters is above the channel's limit of {limit}",
        code="too_long",
        permanent=True,
    )


@dataclass(frozen=True, slots=True)
class Template:
    """An approved message template of a channel (WhatsApp): sent outside the customer
    window. ``provider_id`` is Twilio's ``ContentSid`` or Meta's template name; ``text`` is
    the body with ``{{1}}``-style placeholders, stored in the conversation once filled in."""

    name: str
    provider_id: str
    language: str
    text: str

    @property
    def variables(self) -> int:
        count = 0
        while "{{" + str(count + 1) + "}}" in self.text:
            count += 1
        return count

    def render(self, values: Sequence[str]) -> str:
        text = self.text
        for number, value in enumerate(values, start=1):
            text = text.replace("{{" + str(number) + "}}", value)
        return text


@dataclass(frozen=True, slots=True)
class Choice:
    """A button under a message (Telegram's inline keyboard): ``label`` is what the customer
    sees, ``data`` what comes back when they press it (at most 64 bytes)."""

    label: str
    data: str


class Sender(Protocol):
    """Sends parts on one channel with one account (`channels.*` implement it)."""

    async def send(self, recipient: str, text: str) -> Sent:
        """Send one part (within the channel's limit); raises `DeliveryError`."""
        ...

    async def close(self) -> None: ...


@runtime_checkable
class SentFinder(Protocol):
    """A sender that can ask its provider which messages it accepted (Twilio can; Telegram's
    Bot API has no such look-up)."""

    async def find_sent(self, recipient: str, text: str, since: datetime) -> Sequence[Sent]:
        """The messages with body ``text`` the provider accepted for ``recipient`` from
        ``since`` on, oldest first; raises `DeliveryError` when it cannot be asked."""
        ...


@runtime_checkable
class TypingSender(Protocol):
    """A sender that can show the customer an answer is coming (and mark their message read)."""

    async def keep_typing(
        self, recipient: str, message_id: str | None, until: asyncio.Event
    ) -> None:
        """Show "typing..." from now until ``until`` is set; ``message_id`` is the provider's
        id of the message being answered. Failures are logged, never raised."""
        ...


@runtime_checkable
class TemplateSender(Protocol):
    """A sender that can send an approved template (WhatsApp, outside the 24-hour window)."""

    async def send_template(
        self, recipient: str, template: Template, values: Sequence[str]
    ) -> Sent: ...


@runtime_checkable
class ChoiceSender(Protocol):
    """A sender that can put buttons under a message, and acknowledge a press of one (where
    the channel says `ChannelRules.buttons`)."""

    async def send_choices(self, recipient: str, text: str, choices: Sequence[Choice]) -> Sent:
        """Send one part with ``choices`` as buttons under it; raises `DeliveryError`."""
        ...

    async def acknowledge(self, receipt: str) -> None:
        """Tell the customer's app a press was received (``receipt``: the channel's id of the
        press, `core.inbound.FeedbackAnswer.receipt`). Failures are logged, never raised."""
        ...


class SenderDirectory(Protocol):
    """The sender for an agent's channel (each agent may have its own account), or None
    when the agent has no credentials for it."""

    async def sender_for(self, agent_id: int, channel: str) -> Sender | None: ...


Senders = Mapping[str, Sender] | SenderDirectory  # one sender per channel, or per agent too


async def sender_of(senders: Senders, agent_id: int, channel: str) -> Sender | None:
    """The sender for the agent's channel, from a directory or a plain mapping."""
    if isinstance(senders, Mapping):
        return senders.get(channel)
    return await senders.sender_for(agent_id, channel)


class SourceLink(Protocol):
    """A cited source, as a reply lists it."""

    @property
    def id(self) -> int: ...

    @property
    def url(self) -> str: ...

    @property
    def title(self) -> str: ...


class ChannelRules(Protocol):
    """What core needs to know of a messaging channel: how a reply is written and cut, and
    how long after the customer's last message a free-form reply may still be sent."""

    @property
    def name(self) -> str: ...

    @property
    def title(self) -> str:
        """What staff call the channel (``WhatsApp (Twilio)``)."""
        ...

    @property
    def writing_rule(self) -> str: ...

    @property
    def customer_window_hours(self) -> float | None:
        """None: replies may be sent at any time (Telegram)."""
        ...

    @property
    def buttons(self) -> bool:
        """True: a message may carry buttons the customer answers with (`Choice`, sent by a
        `ChoiceSender`); False: the customer answers in words."""
        ...

    def reply_parts(
        self,
        text: str,
        sources: Sequence[SourceLink] = (),
        *,
        language: str | None = None,
        site: str | None = None,
    ) -> list[str]:
        """``text`` cut into the channel's messages, the sources it cites listed at the end."""
        ...


Channels = Mapping[str, ChannelRules]
