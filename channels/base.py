"""The channel seam: what a messaging channel declares, and the part every channel shares.

A channel is one module under `channels/` exposing one object that satisfies `Channel`:
its name, its webhook routes (verify, parse into `core.inbound.InboundMessage`, store,
acknowledge), its sender, its writing rule and length limit, and its credential fields. The
registry (`channels.registry`) lists them; the gateway, the workers, the admin API, the
console and OpenAPI loop over it, so adding a channel is a module and a line in the list.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

import aiohttp
from aiohttp import web

from channels.citations import reply_parts
from channels.credentials import CredentialField, Credentials, resolve_credentials
from core.delivery import SourceLink, Template
from core.ports import Cache
from core.settings import Settings
from core.store.agents import Agent, Agents
from core.store.inbox import Inbox
from core.store.outbox import Outbox

log = logging.getLogger(__name__)


class ChannelContext:
    """What a channel's webhook handlers work with. The gateway mounts the routes when it is
    built and binds the stores when it starts (the database is open only then); handlers read
    them per request. ``client`` tells who sent a request as rate limits count senders (the
    gateway's: a trusted proxy's word, an IPv6 address as its /64)."""

    def __init__(
        self, settings: Settings, client: Callable[[web.Request], str] | None = None
    ) -> None:
        self.settings = settings
        self.client = client or _peer
        self._stores: tuple[Agents, Inbox, Outbox, Cache] | None = None

    def bind(self, agents: Agents, inbox: Inbox, outbox: Outbox, cache: Cache) -> None:
        self._stores = (agents, inbox, outbox, cache)

    def _bound(self) -> tuple[Agents, Inbox, Outbox, Cache]:
        if self._stores is None:
            raise RuntimeError("the channel's stores are bound when the gateway starts")
        return self._stores

    @property
    def agents(self) -> Agents:
        return self._bound()[0]

    @property
    def inbox(self) -> Inbox:
        return self._bound()[1]

    @property
    def outbox(self) -> Outbox:
        return self._bound()[2]

    @property
    def cache(self) -> Cache:
        return self._bound()[3]


def _peer(request: web.Request) -> str:
    return request.remote or "unknown"


@dataclass(frozen=True, slots=True)
class WebhookDoc:
    """One webhook route, as OpenAPI lists it."""

    method: Literal["get", "post"]
    path: str
    operation_id: str
    summary: str
    content_type: str | None = None  # of the request body


@dataclass(frozen=True, slots=True)
class TemplateIdField:
    """What a channel with a customer window calls the provider's id of an approved template
    (Twilio's Content SID, Meta's template name), and the form it has: the admin API and the
    console check and label it from this."""

    label: str
    pattern: str
    help: str = ""


@dataclass(frozen=True, slots=True)
class SenderSpec:
    """How to build an agent's sender: ``fingerprint`` changes when its credentials do."""

    fingerprint: tuple[str, ...]
    build: Any  # Callable[[], Sender]


class Channel(Protocol):
    """A messaging channel, as the registry lists it."""

    @property
    def name(self) -> str:
        """Stored with every conversation, message and inbox row (``whatsapp``, ``meta``)."""
        ...

    @property
    def title(self) -> str: ...

    @property
    def block(self) -> str:
        """The name of the agent's settings block with its credentials (``twilio``)."""
        ...

    @property
    def credential_fields(self) -> Sequence[CredentialField]: ...

    @property
    def limit(self) -> int: ...

    @property
    def writing_rule(self) -> str: ...

    @property
    def customer_window_hours(self) -> float | None: ...

    @property
    def buttons(self) -> bool:
        """Whether a message may carry buttons the customer answers with (its sender is
        then a `core.delivery.ChoiceSender`)."""
        ...

    @property
    def template_id(self) -> TemplateIdField | None:
        """The form of a template's provider id (None: the channel sends no templates)."""
        ...

    @property
    def webhooks(self) -> Sequence[WebhookDoc]: ...

    def routes(self, context: ChannelContext) -> list[web.RouteDef]: ...

    def sender_spec(self, agent: Agent, settings: Settings) -> SenderSpec | None:
        """How to build the agent's sender, or None without credentials to send with."""
        ...

    def reply_parts(
        self,
        text: str,
        sources: Sequence[SourceLink] = (),
        *,
        language: str | None = None,
        site: str | None = None,
    ) -> list[str]: ...

    async def fetch_media(
        self, http: aiohttp.ClientSession, agent: Agent, settings: Settings, ref: str
    ) -> tuple[bytes, str]:
        """The bytes and content type of an attachment (`core.inbound.MediaItem.ref`)."""
        ...

    def templates(self, agent: Agent) -> list[Template]:
        """The agent's approved templates for this channel (none where it has no window)."""
        ...


class ChannelBase:
    """What every messaging channel shares: its credentials resolved from the declaration,
    its replies cut at its limit with the cited sources listed, its templates read from the
    agent's settings block. A channel module subclasses it and adds its routes and sender."""

    name: str
    title: str
    block: str
    credential_fields: Sequence[CredentialField] = ()
    limit: int
    writing_rule: str
    customer_window_hours: float | None = None
    buttons: bool = False
    template_id: TemplateIdField | None = None
    webhooks: Sequence[WebhookDoc] = ()

    def credentials(self, agent: Agent | None, settings: Settings) -> Credentials:
        """The agent's own credentials, else the environment's; `ChannelNotConfigured`
        when a required field is set in neither."""
        return resolve_credentials(self.title, self.block, self.credential_fields, agent, settings)

    def reply_parts(
        self,
        text: str,
        sources: Sequence[SourceLink] = (),
        *,
        language: str | None = None,
        site: str | None = None,
    ) -> list[str]:
        return reply_parts(text, self.limit, sources, language=language, site=site)

    def templates(self, agent: Agent) -> list[Template]:
        """Templates configured in ``settings[block].templates`` (a list of objects with
        name, provider_id, language and text); malformed entries are left out."""
        if self.customer_window_hours is None:
            return []
        block = agent.settings.get(self.block)
        listed = block.get("templates") if isinstance(block, Mapping) else None
        found = []
        for entry in listed if isinstance(listed, list) else ():
            if not isinstance(entry, Mapping):
                continue
            values = [entry.get(k) for k in ("name", "provider_id", "language", "text")]
            texts = [v for v in values if isinstance(v, str) and v]
            if len(texts) == len(values):
                found.append(Template(*texts))
        return found
