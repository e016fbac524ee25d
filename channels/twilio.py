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

from aiohttp import web
from multidict import MultiDictProxy
from twilio.request_validator import RequestValidator

from channels.credentials import ChannelNotConfigured, twilio_credentials
from channels.inbound import find_agent, read_form
from core.errors import AgentNotFound, Forbidden, InvalidInput
from core.settings import Settings
from core.store.agents import Agent, Agents
from core.store.inbox import Inbox
from core.store.outbox import Outbox
from core.turns import clean_text

log = logging.getLogger(__name__)

CHANNEL = "whatsapp"
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
        return int(value) if isinstance(value, str) else 0
    except ValueError:
        return 0


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


class TwilioChannel:
    def __init__(self, agents: Agents, inbox: Inbox, outbox: Outbox, settings: Settings) -> None:
        self._agents = agents
        self._inbox = inbox
        self._outbox = outbox
        self._settings = settings

    async def status(self, request: web.Request) -> web.Response:
        """``POST /webhooks/twilio/status[?agent=A]``: a delivery report for a sent reply."""
        slug = request.query.get("agent")
        agent = await find_agent(self._agents, slug) if slug else None
        fields = _fields(await self._verified_form(agent, request))
        sid = _text(fields, "MessageSid", MAX_SID_CHARS)
        reported = fields.get("MessageStatus")
        if sid is None or not isinstance(reported, str):
            raise InvalidInput("a Twilio status callback needs MessageSid and MessageStatus")
        status = _STATUSES.get(reported.lower())
        if status is not None:
            senders = [agent.id] if agent is not None else await self._environment_senders(sid)
            applied = await self._outbox.record_status(
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
        for agent_id in await self._outbox.agents_of(CHANNEL, sid):
            try:
                agent = await self._agents.by_id(agent_id)
                if twilio_credentials(agent, self._settings).source == "environment":
                    senders.append(agent_id)
            except (AgentNotFound, ChannelNotConfigured):
                continue
        return senders

    async def webhook(self, request: web.Request) -> web.Response:
        """``POST /webhooks/twilio/{agent}``: an incoming WhatsApp message."""
        agent = await find_agent(self._agents, request.match_info["agent"])
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
        body = fields.get("Body")
        media_only = _num_media(fields.get("NumMedia")) > 0 and not (
            isinstance(body, str) and body.strip()
        )
        payload = {**fields, "media_only": media_only}
        added = await self._inbox.add(agent.id, CHANNEL, sid, sender, payload)
        log.info(
            "twilio.webhook.%s agent=%s sid=%s media_only=%s",
            "stored" if added else "duplicate",
            agent.slug,
            sid,
            media_only,
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
            credentials = twilio_credentials(agent, self._settings)
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
        validator = RequestValidator(credentials.auth_token.get_secret_value())
        if not validator.validate(url, form, signature):
            _reject(name, "invalid_signature", credentials.source)
        return form


def _reject(agent: str, reason: str, credentials: str) -> NoReturn:
    log.warning(
        "twilio.webhook.rejected agent=%s reason=%s credentials=%s", agent, reason, credentials
    )
    raise Forbidden("the request is not signed by Twilio (X-Twilio-Signature)")


def _twiml() -> web.Response:
    return web.Response(text=EMPTY_TWIML, content_type="text/xml")
