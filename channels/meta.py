"""WhatsApp through Meta's Cloud API, inbound: verify the signature, store, answer ``{}``.

``GET /webhooks/meta/{agent}`` answers Meta's subscription check (``hub.challenge`` when
``hub.verify_token`` is the agent's). ``POST /webhooks/meta/{agent}`` carries notifications:
``X-Hub-Signature-256`` is an HMAC-SHA256 of the body's bytes as sent under the app secret,
checked before anything is parsed (re-serialised JSON would not match: Meta escapes
non-ASCII characters). One notification may hold several entries, changes and messages, and
delivery reports (``statuses``) of replies sent; each message becomes an inbox row keyed by
its ``wamid``, so Meta's re-deliveries (it retries for days) are no-ops.

Once the signature is verified the notification is Meta's: a part of it that cannot be read
(an unknown message type, a reaction, a field of the wrong type) is logged and skipped, and
the rest is still stored and acknowledged, since Meta would re-send the whole of it for days.
The reply is sent later by a worker (`channels.meta_send`).
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import re
from collections.abc import Sequence
from typing import Annotated, Any, NoReturn, TypeVar

import aiohttp
from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field, StrictInt, StrictStr

from channels.base import ChannelBase, ChannelContext, SenderSpec, TemplateIdField, WebhookDoc
from channels.credentials import ChannelNotConfigured, CredentialField, Credentials
from channels.inbound import check_charset, find_agent, parse_json, validated
from channels.meta_send import MAX_TEXT_CHARS, MetaSender
from core.errors import Forbidden, InvalidInput, MediaUnavailable
from core.inbound import InboundMessage, MediaItem, MediaKind
from core.media import fetch_media, is_refused, require_guarded
from core.settings import Settings
from core.store.agents import Agent
from core.turns import clean_payload

log = logging.getLogger(__name__)
M = TypeVar("M", bound=BaseModel)

CHANNEL = "meta"
SIGNATURE_HEADER = "X-Hub-Signature-256"
SIGNATURE_PREFIX = "sha256="
OBJECT = "whatsapp_business_account"
# Meta's challenge is a number; anything much longer is not Meta's.
MAX_CHALLENGE_CHARS = 256
# What a customer may type or caption; WhatsApp caps text at 4096 characters, counted its way.
MAX_INBOUND_CHARS = 16_384
# A media id as the Graph API gives it (digits), and as it goes into a URL path.
_MEDIA_ID = re.compile(r"[0-9A-Za-z_-]{1,128}")
# Where the Graph API says a customer's file is, and which wants the access token too (Meta's
# Cloud API documentation: "GET <media url>" with the same Bearer token). A URL on any other
# host is read without it.
MEDIA_HOST = "https://lookaside.fbsbx.com"

_Id = Annotated[StrictStr, Field(min_length=1, max_length=256)]
_Text = Annotated[StrictStr, Field(max_length=MAX_INBOUND_CHARS)]


class _Shape(BaseModel):
    """The parts of a notification that are read here, with the Cloud API's types. Meta adds
    fields without notice: the others are not checked, and the row keeps the message as sent."""

    model_config = ConfigDict(extra="ignore", frozen=True, populate_by_name=True)


class MetaProfile(_Shape):
    name: StrictStr | None = Field(None, max_length=256)


class MetaContact(_Shape):
    wa_id: StrictStr | None = Field(None, max_length=64)
    profile: MetaProfile | None = None


class MetaMetadata(_Shape):
    phone_number_id: StrictStr | None = Field(None, max_length=64)
    display_phone_number: StrictStr | None = Field(None, max_length=64)


class MetaText(_Shape):
    body: _Text = ""


class MetaMedia(_Shape):
    id: StrictStr = Field(min_length=1, max_length=128)
    mime_type: StrictStr | None = Field(None, max_length=200)
    caption: _Text | None = None


class MetaButton(_Shape):
    """A tap on a template's quick-reply button."""

    text: _Text | None = None


class MetaReply(_Shape):
    title: _Text | None = None


class MetaInteractive(_Shape):
    """A choice from an interactive list or reply buttons."""

    button_reply: MetaReply | None = None
    list_reply: MetaReply | None = None


class MetaMessage(_Shape):
    sender: StrictStr = Field(alias="from", min_length=1, max_length=64)
    id: _Id
    timestamp: StrictStr | None = Field(None, max_length=32)
    type: StrictStr = Field(max_length=64)
    text: MetaText | None = None
    audio: MetaMedia | None = None
    voice: MetaMedia | None = None
    image: MetaMedia | None = None
    video: MetaMedia | None = None
    document: MetaMedia | None = None
    sticker: MetaMedia | None = None
    button: MetaButton | None = None
    interactive: MetaInteractive | None = None


class MetaStatusError(_Shape):
    code: StrictInt | None = None


class MetaStatus(_Shape):
    id: _Id
    status: StrictStr = Field(max_length=32)
    errors: list[MetaStatusError] | None = None


class MetaValue(_Shape):
    """A ``messages`` change; its messages and statuses are read one by one."""

    metadata: MetaMetadata | None = None
    contacts: list[dict[str, Any]] = []
    messages: list[dict[str, Any]] = []
    statuses: list[dict[str, Any]] = []


class MetaChange(_Shape):
    field: StrictStr
    value: dict[str, Any] = {}


class MetaEntry(_Shape):
    changes: list[dict[str, Any]] = []


class MetaNotification(_Shape):
    object: StrictStr
    entry: list[dict[str, Any]] = []


# The message types answered, and the attachment kind each carries (None: text only).
_KINDS: dict[str, MediaKind | None] = {
    "text": None,
    "button": None,
    "interactive": None,
    "audio": "audio",
    "voice": "audio",
    "image": "image",
    "video": "video",
    "document": "document",
    "sticker": "sticker",
}

# Meta's delivery statuses, mapped onto the outbox's; others ("deleted", "warning") are not.
_STATUSES = {"sent": "sent", "delivered": "delivered", "read": "read", "failed": "failed"}


def _text(message: MetaMessage) -> str:
    if message.text is not None:
        return message.text.body.strip()
    if message.button is not None:
        return (message.button.text or "").strip()
    if message.interactive is not None:
        reply = message.interactive.button_reply or message.interactive.list_reply
        return (reply.title or "").strip() if reply is not None else ""
    media = _attachment(message)
    return (media.caption or "").strip() if media is not None else ""


def _attachment(message: MetaMessage) -> MetaMedia | None:
    if _KINDS.get(message.type) is None:
        return None
    media: MetaMedia | None = getattr(message, message.type)
    return media


def parse_message(
    message: MetaMessage, contacts: Sequence[MetaContact], phone_number_id: str | None
) -> InboundMessage:
    """A Cloud API message as every channel gives it."""
    name = next(
        (c.profile.name for c in contacts if c.wa_id == message.sender and c.profile is not None),
        None,
    )
    media = _attachment(message)
    kind = _KINDS.get(message.type)
    items = () if media is None or kind is None else (MediaItem(kind, media.id, media.mime_type),)
    extra: dict[str, Any] = {"type": message.type}
    if phone_number_id:
        extra["phone_number_id"] = phone_number_id
    if message.timestamp:
        extra["timestamp"] = message.timestamp
    return InboundMessage(
        customer_id=message.sender,
        provider_message_id=message.id,
        text=_text(message),
        display_name=(name or "").strip() or None,
        media=items,
        extra=extra,
    )


def _valid(model: type[M], data: Any, agent: Agent, what: str) -> M | None:
    """``data`` as ``model``, or None (logged) when it does not fit."""
    try:
        return validated(model, data)
    except InvalidInput as exc:
        log.warning(
            "meta.webhook.skipped agent=%s part=%s reason=malformed detail=%s",
            agent.slug,
            what,
            exc.message[:200],
        )
        return None


class MetaWhatsApp(ChannelBase):
    """WhatsApp through Meta's Cloud API (the Graph API)."""

    name = CHANNEL
    title = "WhatsApp (Meta)"
    block = "meta"
    credential_fields = (
        CredentialField(
            "app_secret",
            "App secret",
            "meta_app_secret",
            secret=True,
            required=True,
            help="the Meta app's secret: it signs every webhook (X-Hub-Signature-256)",
        ),
        CredentialField(
            "verify_token",
            "Verify token",
            "meta_verify_token",
            secret=True,
            required=True,
            help="any text, given to Meta with the webhook URL",
        ),
        CredentialField(
            "access_token",
            "Access token",
            "meta_access_token",
            secret=True,
            help="a system user's permanent token with whatsapp_business_messaging",
        ),
        CredentialField(
            "phone_number_id",
            "Phone number ID",
            "meta_phone_number_id",
            pattern=r"[0-9]{1,32}",
            help="digits, as WhatsApp Manager shows the number's id",
        ),
    )
    limit = MAX_TEXT_CHARS
    writing_rule = (
        "You are writing a WhatsApp message: plain text, *bold* allowed, no tables, "
        "no headings, short paragraphs."
    )
    customer_window_hours = 24.0
    template_id = TemplateIdField(
        "Template name",
        r"[a-z0-9_]{1,512}",
        "the template's name in WhatsApp Manager: lowercase letters, digits and underscores",
    )
    webhooks: Sequence[WebhookDoc] = (
        WebhookDoc(
            "get",
            "/webhooks/meta/{agent}",
            "meta_verify",
            "Meta WhatsApp Cloud API subscription check (hub.mode, hub.verify_token, "
            "hub.challenge)",
        ),
        WebhookDoc(
            "post",
            "/webhooks/meta/{agent}",
            "meta_webhook",
            "Meta WhatsApp Cloud API webhook (JSON, signed with X-Hub-Signature-256)",
            "application/json",
        ),
    )

    def routes(self, context: ChannelContext) -> list[web.RouteDef]:
        hooks = MetaWebhooks(self, context)
        return [
            web.get("/webhooks/meta/{agent}", hooks.verify, allow_head=False),
            web.post("/webhooks/meta/{agent}", hooks.webhook),
        ]

    async def check_credentials(self, agent: Agent | None, settings: Settings) -> str:
        """The sending number the agent's credentials (None: the environment's) reach, as the
        Graph API says (`parley doctor`); `ChannelNotConfigured` or
        `core.delivery.DeliveryError` when replies cannot be sent with them."""
        credentials = self.credentials(agent, settings)
        token = credentials.text("access_token")
        number = credentials.text("phone_number_id")
        if not token or not number:
            missing = "access_token" if not token else "phone_number_id"
            raise ChannelNotConfigured(f"no {missing}: replies cannot be sent")
        sender = MetaSender(
            token,
            number,
            api_base=str(settings.meta_api_base),
            api_version=settings.meta_api_version,
            timeout=settings.meta_send_timeout_seconds,
        )
        try:
            return await sender.check()
        finally:
            await sender.close()

    def sender_spec(self, agent: Agent, settings: Settings) -> SenderSpec | None:
        try:
            credentials = self.credentials(agent, settings)
        except ChannelNotConfigured:
            return None
        token = credentials.text("access_token")
        number = credentials.text("phone_number_id")
        if not token or not number:
            return None
        base, version = str(settings.meta_api_base), settings.meta_api_version
        return SenderSpec(
            (token, number, base, version),
            lambda: MetaSender(
                token,
                number,
                api_base=base,
                api_version=version,
                timeout=settings.meta_send_timeout_seconds,
            ),
        )

    async def fetch_media(
        self, http: aiohttp.ClientSession, agent: Agent, settings: Settings, ref: str
    ) -> tuple[bytes, str]:
        """An attachment by its media id: the Graph API gives its URL, type and size, then
        the file is read from that URL. The access token goes to the Graph API and to Meta's
        media host (`MEDIA_HOST`, which wants it), never to a URL elsewhere. ``http`` is the
        guarded media session (`core.media.media_session`)."""
        require_guarded(http)
        token = self.credentials(agent, settings).text("access_token")
        if not token:
            raise ChannelNotConfigured(f"no Meta access token for agent {agent.slug!r}")
        if not _MEDIA_ID.fullmatch(ref):
            raise MediaUnavailable("url", transient=False)
        headers = {"Authorization": f"Bearer {token}"}
        base = str(settings.meta_api_base).rstrip("/")
        url, mime_type = await _media_info(
            http,
            f"{base}/{settings.meta_api_version}/{ref}",
            headers,
            max_bytes=settings.media_max_bytes,
            timeout=settings.media_timeout_seconds,
        )
        # Never read in the clear what the API itself gives over https.
        if base.startswith("https://") and not url.startswith("https://"):
            raise MediaUnavailable("url", transient=False)
        media = await fetch_media(
            http,
            url,
            headers=headers,
            provider=(base, MEDIA_HOST),
            max_bytes=settings.media_max_bytes,
            timeout=settings.media_timeout_seconds,
        )
        return media.data, mime_type or media.content_type


async def _media_info(
    http: aiohttp.ClientSession,
    url: str,
    headers: dict[str, str],
    *,
    max_bytes: int,
    timeout: float,  # noqa: ASYNC109 - passed to aiohttp
) -> tuple[str, str | None]:
    """The download URL and content type (without parameters) of a media id."""
    try:
        async with http.get(
            url,
            headers=headers,
            allow_redirects=False,
            raise_for_status=False,
            timeout=aiohttp.ClientTimeout(total=timeout),
        ) as response:
            status = response.status
            try:
                info = await response.json(content_type=None)
            except ValueError:
                info = None
    except TimeoutError:
        raise _media_failed("timeout", transient=True) from None
    except aiohttp.ClientError as exc:
        if is_refused(exc):
            raise _media_failed("refused", transient=False) from None
        raise _media_failed("connection", transient=True) from None
    if status != 200:
        raise _media_failed(f"http_{status}", transient=status >= 500 or status == 429)
    info = info if isinstance(info, dict) else {}
    found, size, mime = info.get("url"), info.get("file_size"), info.get("mime_type")
    if not isinstance(found, str) or not found:
        raise _media_failed("url", transient=False)
    if isinstance(size, int | str) and str(size).isdigit() and int(size) > max_bytes:
        raise _media_failed("too_large", transient=False)
    kind = mime.split(";", 1)[0].strip().lower() if isinstance(mime, str) else ""
    return found, kind or None


def _media_failed(reason: str, *, transient: bool) -> MediaUnavailable:
    log.warning("meta.media.failed reason=%s transient=%s", reason, transient)
    return MediaUnavailable(reason, transient=transient)


class MetaWebhooks:
    """The webhook handlers, with what they work with."""

    def __init__(self, channel: MetaWhatsApp, context: ChannelContext) -> None:
        self._channel = channel
        self._context = context  # its stores are bound when the gateway starts
        self._settings = context.settings

    async def verify(self, request: web.Request) -> web.Response:
        """``GET /webhooks/meta/{agent}``: Meta checks the URL before it subscribes it."""
        agent = await find_agent(self._context.agents, request.match_info["agent"])
        try:
            token = self._credentials(agent).secret("verify_token")
        except ChannelNotConfigured:
            log.warning("meta.verify.rejected agent=%s reason=not_configured", agent.slug)
            raise
        given = request.query.get("hub.verify_token", "")
        expected = token.get_secret_value() if token is not None else ""
        mode_ok = request.query.get("hub.mode") == "subscribe"
        # Compared in full even when the mode is wrong, so the time says nothing of the token.
        token_ok = hmac.compare_digest(given.encode(), expected.encode()) and bool(expected)
        if not (mode_ok and token_ok):
            reason = "mode" if not mode_ok else "missing_token" if not given else "wrong_token"
            log.warning("meta.verify.rejected agent=%s reason=%s", agent.slug, reason)
            raise Forbidden("not a subscription check from Meta (hub.verify_token)")
        challenge = request.query.get("hub.challenge", "")
        if not challenge or len(challenge) > MAX_CHALLENGE_CHARS:
            raise InvalidInput(f"hub.challenge must be 1-{MAX_CHALLENGE_CHARS} characters")
        log.info("meta.verify.accepted agent=%s", agent.slug)
        return web.Response(text=challenge, content_type="text/plain")

    async def webhook(self, request: web.Request) -> web.Response:
        """``POST /webhooks/meta/{agent}``: messages and delivery reports from Meta."""
        agent = await find_agent(self._context.agents, request.match_info["agent"])
        credentials, raw = await self._verified_body(agent, request)
        check_charset(request)
        data = clean_payload(parse_json(raw))  # a "\u0000" anywhere would make the jsonb row fail
        notification = _valid(MetaNotification, data, agent, "notification")
        if notification is None or notification.object != OBJECT:
            kind = notification.object[:40] if notification is not None else "malformed"
            log.info("meta.webhook.ignored agent=%s object=%s", agent.slug, kind)
            return web.json_response({})
        number = credentials.text("phone_number_id")
        for entry_data in notification.entry:
            entry = _valid(MetaEntry, entry_data, agent, "entry")
            for change_data in entry.changes if entry is not None else ():
                change = _valid(MetaChange, change_data, agent, "change")
                if change is None:
                    continue
                if change.field != "messages":
                    log.info(
                        "meta.webhook.ignored agent=%s field=%s", agent.slug, change.field[:40]
                    )
                    continue
                value = _valid(MetaValue, change.value, agent, "value")
                if value is not None:
                    await self._value(agent, number, value, change.value)
        return web.json_response({})

    async def _value(
        self, agent: Agent, number: str | None, value: MetaValue, value_data: dict[str, Any]
    ) -> None:
        """One ``messages`` change: its messages to the inbox, its statuses to the outbox."""
        metadata = value.metadata
        to_number = metadata.phone_number_id if metadata is not None else None
        if number is not None and to_number != number:
            # Another number of the same business account: its messages are another agent's.
            log.warning(
                "meta.webhook.ignored agent=%s reason=other_number messages=%d statuses=%d",
                agent.slug,
                len(value.messages),
                len(value.statuses),
            )
            return
        contacts = [
            c for c in (_valid(MetaContact, d, agent, "contact") for d in value.contacts) if c
        ]
        for message_data in value.messages:
            message = _valid(MetaMessage, message_data, agent, "message")
            if message is not None:
                await self._message(agent, message, message_data, value_data, contacts)
        for status_data in value.statuses:
            status = _valid(MetaStatus, status_data, agent, "status")
            if status is not None:
                await self._status(agent, status)

    async def _message(
        self,
        agent: Agent,
        message: MetaMessage,
        data: dict[str, Any],
        value_data: dict[str, Any],
        contacts: list[MetaContact],
    ) -> None:
        if message.type not in _KINDS or (
            _KINDS[message.type] is not None and _attachment(message) is None
        ):
            # Reactions, locations, system notices, "unsupported": nothing to answer.
            log.info(
                "meta.webhook.ignored agent=%s wamid=%s type=%s",
                agent.slug,
                message.id,
                message.type[:40],
            )
            return
        metadata = value_data.get("metadata")
        metadata = metadata if isinstance(metadata, dict) else {}
        number = metadata.get("phone_number_id")
        inbound = parse_message(message, contacts, number if isinstance(number, str) else None)
        # What staff see: the change's value narrowed to this message and its sender's contact.
        raw = {
            "metadata": metadata,
            "contacts": [c for c in value_data.get("contacts") or () if _sent_by(c, message)],
            "messages": [data],
        }
        added = await self._context.inbox.add(agent.id, CHANNEL, inbound, raw)
        log.info(
            "meta.webhook.%s agent=%s wamid=%s type=%s media=%d",
            "stored" if added else "duplicate",
            agent.slug,
            message.id,
            message.type,
            len(inbound.media),
        )

    async def _status(self, agent: Agent, status: MetaStatus) -> None:
        mapped = _STATUSES.get(status.status)
        if mapped is None:
            log.info("meta.status.ignored agent=%s status=%s", agent.slug, status.status[:32])
            return
        code = next((e.code for e in status.errors or () if e.code is not None), None)
        applied = await self._context.outbox.record_status(
            CHANNEL,
            status.id,
            mapped,
            None if code is None else str(code),
            agent_ids=[agent.id],
        )
        log.info(
            "meta.status agent=%s wamid=%s status=%s applied=%s",
            agent.slug,
            status.id,
            mapped,
            applied,
        )

    async def _verified_body(self, agent: Agent, request: web.Request) -> tuple[Credentials, bytes]:
        """The body's bytes, once ``X-Hub-Signature-256`` proves Meta sent them; else 403."""
        try:
            credentials = self._credentials(agent)
        except ChannelNotConfigured:
            log.warning("meta.webhook.rejected agent=%s reason=not_configured", agent.slug)
            raise
        given = request.headers.get(SIGNATURE_HEADER, "")
        if not given:
            _reject(agent, "missing_signature", credentials.source)
        raw = await request.read()
        secret = credentials.secret("app_secret")
        key = secret.get_secret_value().encode() if secret is not None else b""
        expected = SIGNATURE_PREFIX + hmac.new(key, raw, hashlib.sha256).hexdigest()
        if not hmac.compare_digest(
            expected.encode(), given.strip().lower().encode(errors="replace")
        ):
            _reject(agent, "invalid_signature", credentials.source)
        return credentials, raw

    def _credentials(self, agent: Agent) -> Credentials:
        return self._channel.credentials(agent, self._settings)


def _sent_by(contact: Any, message: MetaMessage) -> bool:
    return isinstance(contact, dict) and contact.get("wa_id") == message.sender


def _reject(agent: Agent, reason: str, credentials: str) -> NoReturn:
    log.warning(
        "meta.webhook.rejected agent=%s reason=%s credentials=%s", agent.slug, reason, credentials
    )
    raise Forbidden("the request is not signed by Meta (X-Hub-Signature-256)")


META = MetaWhatsApp()
