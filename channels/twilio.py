"""WhatsApp through Twilio, inbound: verify the signature, write the inbox row, answer empty TwiML.

The reply is sent later by a worker through the REST API (`channels.twilio_send`), so the
webhook answers within milliseconds and a re-delivery of the same ``MessageSid`` is a no-op.
The form is read by `channels.inbound`: a body that is not a UTF-8 form is a 400.

Delivery reports (``POST /webhooks/twilio/status?agent=A``) are verified with agent A's
credentials and change only A's messages: an account can never mark another's as read or
failed. A report without ``agent`` (a reply sent before the callback named its agent) is
verified with the environment's credentials and changes only messages of agents that send
with the environment's account.
"""

from __future__ import annotations

import logging
from typing import NoReturn
from urllib.parse import urlsplit

import aiohttp
from aiohttp import web
from multidict import MultiDictProxy
from twilio.request_validator import RequestValidator, compare

from channels.base import ChannelBase, ChannelContext, SenderSpec, TemplateIdField, WebhookDoc
from channels.credentials import ChannelNotConfigured, CredentialField, Credentials
from channels.inbound import find_agent, read_form
from channels.twilio_send import TwilioSender
from core.errors import AgentNotFound, Forbidden, InvalidInput
from core.inbound import InboundMessage, MediaItem, MediaKind
from core.media import fetch_media
from core.settings import Settings
from core.store.agents import Agent
from core.turns import clean_text

log = logging.getLogger(__name__)

CHANNEL = "whatsapp"
FORM_TYPE = "application/x-www-form-urlencoded"
SIGNATURE_HEADER = "X-Twilio-Signature"
# Any other body (text/plain, JSON) would reach the user as a message or raise a warning.
EMPTY_TWIML = '<?xml version="1.0" encoding="UTF-8"?><Response/>'
# Twilio's message ids are 34 characters; a sender is "whatsapp:+E164". Both are indexed
# (the inbox's unique key, its conversations), so a value Twilio never sends is refused.
MAX_SID_CHARS = 64
MAX_SENDER_CHARS = 200
MAX_ERROR_CODE_CHARS = 16


def signed_url(request: web.Request, public_url: str | None) -> str:
    """The URL Twilio signed: behind TLS termination the public one, else the request's own.

    ``raw_path`` keeps the path and query exactly as sent (percent-escapes included), which
    is what the signature covers.
    """
    if public_url:
        url = public_url.rstrip("/") + request.raw_path
    else:
        url = f"{request.scheme}://{request.host}{request.raw_path}"
    try:
        # What the validator does with it: a Host such as "a:b" has no port to read, and
        # header bytes that are not UTF-8 cannot be hashed.
        url.encode()
        _ = urlsplit(url).port
    except ValueError:
        raise InvalidInput("the request's Host header is not a host name and port") from None
    return url


def _fields(form: MultiDictProxy[str]) -> dict[str, str | list[str]]:
    """Every form field, kept as sent (Twilio adds fields without notice) but for the control
    characters PostgreSQL cannot store; read only after the signature is checked."""
    fields: dict[str, str | list[str]] = {}
    for name in form:
        if name in fields:
            continue
        values = [clean_text(str(v)) for v in form.getall(name)]
        fields[clean_text(name)] = values[0] if len(values) == 1 else values
    return fields


def _text(fields: dict[str, str | list[str]], name: str, limit: int) -> str | None:
    """A field sent once, not blank and at most ``limit`` characters; else None."""
    value = fields.get(name)
    if isinstance(value, str) and value.strip() and len(value) <= limit:
        return value
    return None


def _num_media(value: str | list[str] | None) -> int:
    try:
        return max(0, min(int(value), 10)) if isinstance(value, str) else 0
    except ValueError:
        return 0


def _media_kind(content_type: str | None) -> MediaKind:
    major = (content_type or "").split("/", 1)[0]
    if major in ("audio", "image", "video"):
        return major  # type: ignore[return-value]
    return "document" if major == "application" else "other"


def parse_message(fields: dict[str, str | list[str]], sid: str, sender: str) -> InboundMessage:
    """A Twilio WhatsApp message as every channel gives it."""
    body = fields.get("Body")
    media = []
    for n in range(_num_media(fields.get("NumMedia"))):
        url = _text(fields, f"MediaUrl{n}", 2000)
        if url is not None:
            kind = _text(fields, f"MediaContentType{n}", 200)
            media.append(MediaItem(_media_kind(kind), url, kind))
    return InboundMessage(
        customer_id=sender,
        provider_message_id=sid,
        text=body.strip() if isinstance(body, str) else "",
        display_name=_text(fields, "ProfileName", 200),
        media=tuple(media),
    )


# Twilio's message statuses, mapped onto the outbox's; others (accepted, scheduled) are ignored.
_STATUSES = {
    "queued": "sent",
    "sending": "sent",
    "sent": "sent",
    "delivered": "delivered",
    "read": "read",
    "failed": "failed",
    "undelivered": "undelivered",
}


class TwilioWhatsApp(ChannelBase):
    """WhatsApp through Twilio's Messaging API."""

    name = CHANNEL
    title = "WhatsApp (Twilio)"
    block = "twilio"
    credential_fields = (
        CredentialField(
            "account_sid",
            "Twilio account SID",
            "twilio_account_sid",
            pattern=r"AC[0-9a-fA-F]{32}",
            help="AC followed by 32 hexadecimal digits",
        ),
        CredentialField(
            "auth_token", "Twilio auth token", "twilio_auth_token", secret=True, required=True
        ),
        CredentialField(
            "whatsapp_from",
            "WhatsApp number",
            "twilio_whatsapp_from",
            pattern=r"(whatsapp:)?\+[1-9][0-9]{6,14}",
            help="the sending number in international form, such as whatsapp:+14155238886",
        ),
    )
    limit = TwilioSender.limit
    writing_rule = (
        "You are writing a WhatsApp message: plain text, *bold* allowed, no tables, "
        "no headings, short paragraphs."
    )
    customer_window_hours = 24.0
    template_id = TemplateIdField(
        "Content SID",
        r"HX[0-9a-fA-F]{32}",
        "HX followed by 32 hexadecimal digits, from Twilio's Content Template Builder",
    )
    webhooks = (
        WebhookDoc(
            "post",
            "/webhooks/twilio/{agent}",
            "twilio_webhook",
            "Twilio WhatsApp webhook (form-encoded, signed with X-Twilio-Signature)",
            FORM_TYPE,
        ),
        WebhookDoc(
            "post",
            "/webhooks/twilio/status",
            "twilio_status",
            "Twilio delivery-status callback",
            FORM_TYPE,
        ),
    )

    def routes(self, context: ChannelContext) -> list[web.RouteDef]:
        hooks = TwilioWebhooks(self, context)
        # The status route first, or an agent named "status" would shadow it.
        return [
            web.post("/webhooks/twilio/status", hooks.status),
            web.post("/webhooks/twilio/{agent}", hooks.webhook),
        ]

    def sender_spec(self, agent: Agent, settings: Settings) -> SenderSpec | None:
        try:
            credentials = self.credentials(agent, settings)
        except ChannelNotConfigured:
            return None
        sid, sender_from = credentials.text("account_sid"), credentials.text("whatsapp_from")
        token = credentials.text("auth_token")
        if not sid or not sender_from or not token:
            return None
        callback = None
        if settings.public_url:
            # Verified with the agent's credentials, and changes only its messages.
            callback = f"{settings.public_url}/webhooks/twilio/status?agent={agent.slug}"
        return SenderSpec(
            (sid, token, sender_from, callback or ""),
            lambda: TwilioSender(
                sid,
                token,
                sender_from,
                api_base=str(settings.twilio_api_base),
                status_callback=callback,
                timeout=settings.twilio_send_timeout_seconds,
            ),
        )

    async def check_credentials(self, agent: Agent | None, settings: Settings) -> str:
        """The account the agent's credentials (None: the environment's) belong to, as
        Twilio says (`parley doctor`); `ChannelNotConfigured` or `core.delivery.DeliveryError`
        when replies cannot be sent with them."""
        credentials = self.credentials(agent, settings)
        sid, token = credentials.text("account_sid"), credentials.text("auth_token")
        sender_from = credentials.text("whatsapp_from")
        if not sid or not token or not sender_from:
            missing = "account_sid" if not sid else "auth_token" if not token else "whatsapp_from"
            raise ChannelNotConfigured(f"no {missing}: replies cannot be sent")
        sender = TwilioSender(
            sid,
            token,
            sender_from,
            api_base=str(settings.twilio_api_base),
            timeout=settings.twilio_send_timeout_seconds,
        )
        try:
            return await sender.check()
        finally:
            await sender.close()

    async def fetch_media(
        self, http: aiohttp.ClientSession, agent: Agent, settings: Settings, ref: str
    ) -> tuple[bytes, str]:
        """A media URL of the message, fetched with the account's Basic auth when it is on
        Twilio's API host (``PARLEY_TWILIO_API_BASE``), without it anywhere else; Twilio then
        redirects to a short-lived signed URL, fetched without it. ``http`` is the guarded
        media session (`core.media.media_session`)."""
        credentials = self.credentials(agent, settings)
        sid, token = credentials.text("account_sid"), credentials.text("auth_token")
        auth = (sid, token) if sid and token else None
        media = await fetch_media(
            http,
            ref,
            auth=auth,
            provider=(str(settings.twilio_api_base),),
            max_bytes=settings.media_max_bytes,
            timeout=settings.media_timeout_seconds,
        )
        return media.data, media.content_type


class TwilioWebhooks:
    """The webhook handlers, with what they work with."""

    def __init__(self, channel: TwilioWhatsApp, context: ChannelContext) -> None:
        self._channel = channel
        self._context = context
        self._settings = context.settings

    async def status(self, request: web.Request) -> web.Response:
        """``POST /webhooks/twilio/status[?agent=A]``: a delivery report for a sent reply."""
        slug = request.query.get("agent")
        agent = await find_agent(self._context.agents, slug) if slug else None
        fields = _fields(await self._verified_form(agent, request))
        sid = _text(fields, "MessageSid", MAX_SID_CHARS)
        reported = fields.get("MessageStatus")
        if sid is None or not isinstance(reported, str):
            raise InvalidInput("a Twilio status callback needs MessageSid and MessageStatus")
        status = _STATUSES.get(reported.lower())
        if status is not None:
            senders = [agent.id] if agent is not None else await self._environment_senders(sid)
            applied = await self._context.outbox.record_status(
                CHANNEL,
                sid,
                status,
                _text(fields, "ErrorCode", MAX_ERROR_CODE_CHARS),
                agent_ids=senders,
            )
            log.info(
                "twilio.status agent=%s sid=%s status=%s applied=%s",
                agent.slug if agent else "-",
                sid,
                status,
                applied,
            )
        return _twiml()

    async def _environment_senders(self, sid: str) -> list[int]:
        """The agents that sent message ``sid`` with the environment's Twilio account: those
        whose reports a callback verified with the environment's credentials may change."""
        senders = []
        for agent_id in await self._context.outbox.agents_of(CHANNEL, sid):
            try:
                agent = await self._context.agents.by_id(agent_id)
                if self._credentials(agent).source == "environment":
                    senders.append(agent_id)
            except (AgentNotFound, ChannelNotConfigured):
                continue
        return senders

    async def webhook(self, request: web.Request) -> web.Response:
        """``POST /webhooks/twilio/{agent}``: an incoming WhatsApp message."""
        agent = await find_agent(self._context.agents, request.match_info["agent"])
        form = await self._verified_form(agent, request)
        fields = _fields(form)
        if "MessageStatus" in fields:
            # A status callback pointed at the message URL: not a message, never answer it.
            log.info("twilio.webhook.ignored agent=%s kind=status", agent.slug)
            return _twiml()
        sid = _text(fields, "MessageSid", MAX_SID_CHARS)
        sender = _text(fields, "From", MAX_SENDER_CHARS)
        if sid is None or sender is None:
            raise InvalidInput(
                f"a Twilio message webhook needs MessageSid (at most {MAX_SID_CHARS} "
                f"characters) and From (at most {MAX_SENDER_CHARS})"
            )
        message = parse_message(fields, sid, sender)
        added = await self._context.inbox.add(agent.id, CHANNEL, message, fields)
        log.info(
            "twilio.webhook.%s agent=%s sid=%s media=%d",
            "stored" if added else "duplicate",
            agent.slug,
            sid,
            len(message.media),
        )
        return _twiml()

    async def _verified_form(
        self, agent: Agent | None, request: web.Request
    ) -> MultiDictProxy[str]:
        """The form fields, once ``X-Twilio-Signature`` proves Twilio sent them; else 403
        (400 when the body is no UTF-8 form, see `read_form`). Without an agent (status
        callbacks), the environment's credentials are used."""
        name = agent.slug if agent else "-"
        try:
            credentials = self._credentials(agent)
        except ChannelNotConfigured:
            log.warning("twilio.webhook.rejected agent=%s reason=not_configured", name)
            raise
        signature = request.headers.get(SIGNATURE_HEADER, "")
        if not signature:
            _reject(name, "missing_signature", credentials.source)
        try:
            form = await read_form(request)
            url = signed_url(request, self._settings.public_url)
        except InvalidInput:
            log.warning("twilio.webhook.rejected agent=%s reason=malformed", name)
            raise
        validator = RequestValidator(credentials.text("auth_token"))
        # The URL as Twilio requested it first, one HMAC; `validate` tries it with and without
        # the default port (two more), which only a signature for another spelling needs.
        exact = compare(validator.compute_signature(url, form), signature)
        if not exact and not validator.validate(url, form, signature):
            _reject(name, "invalid_signature", credentials.source)
        return form

    def _credentials(self, agent: Agent | None) -> Credentials:
        return self._channel.credentials(agent, self._settings)


def _reject(agent: str, reason: str, credentials: str) -> NoReturn:
    log.warning(
        "twilio.webhook.rejected agent=%s reason=%s credentials=%s", agent, reason, credentials
    )
    raise Forbidden("the request is not signed by Twilio (X-Twilio-Signature)")


def _twiml() -> web.Response:
    return web.Response(text=EMPTY_TWIML, content_type="text/xml")


TWILIO = TwilioWhatsApp()
