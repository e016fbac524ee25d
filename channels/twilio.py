"""WhatsApp through Twilio, inbound: verify the signature, write the inbox row, answer empty TwiML.

The reply is sent later by a worker through the REST API (`channels.twilio_send`), so the
webhook answers within milliseconds and a re-delivery of the same ``MessageSid`` is a no-op.
"""

from __future__ import annotations

import logging
from typing import Any

from aiohttp import web
from multidict import MultiDictProxy
from twilio.request_validator import RequestValidator

from channels.credentials import ChannelNotConfigured, twilio_credentials
from core.errors import Forbidden, InvalidInput
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


def signed_url(request: web.Request, public_url: str | None) -> str:
    """The URL Twilio signed: behind TLS termination the public one, else the request's own.

    ``raw_path`` keeps the path and query exactly as sent (percent-escapes included), which
    is what the signature covers.
    """
    if public_url:
        return public_url.rstrip("/") + request.raw_path
    return f"{request.scheme}://{request.host}{request.raw_path}"


def _fields(form: MultiDictProxy[Any]) -> dict[str, str | list[str]]:
    """Every form field, kept as sent (Twilio adds fields without notice) but for the control
    characters PostgreSQL cannot store; read only after the signature is checked."""
    fields: dict[str, str | list[str]] = {}
    for name in form:
        if name in fields:
            continue
        values = [clean_text(str(v)) for v in form.getall(name)]
        fields[clean_text(name)] = values[0] if len(values) == 1 else values
    return fields


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
        agent = await self._agents.get(slug) if slug else None
        form = await self._verified_form(agent, request)
        sid, reported = form.get("MessageSid"), form.get("MessageStatus")
        if not isinstance(sid, str) or not isinstance(reported, str):
            raise InvalidInput("a Twilio status callback needs MessageSid and MessageStatus")
        status = _STATUSES.get(reported.lower())
        code = form.get("ErrorCode")
        if status is not None:
            applied = await self._outbox.record_status(
                CHANNEL, sid, status, code if isinstance(code, str) and code else None
            )
            log.info("twilio.status sid=%s status=%s applied=%s", sid, status, applied)
        return _twiml()

    async def webhook(self, request: web.Request) -> web.Response:
        """``POST /webhooks/twilio/{agent}``: an incoming WhatsApp message."""
        agent = await self._agents.get(request.match_info["agent"])
        form = await self._verified_form(agent, request)
        fields = _fields(form)
        if "MessageStatus" in fields:
            # A status callback pointed at the message URL: not a message, never answer it.
            log.info("twilio.webhook.ignored agent=%s kind=status", agent.slug)
            return _twiml()
        sid, sender = fields.get("MessageSid"), fields.get("From")
        if not isinstance(sid, str) or not sid or not isinstance(sender, str) or not sender:
            raise InvalidInput("a Twilio message webhook needs MessageSid and From")
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
    ) -> MultiDictProxy[Any]:
        """The form fields, once ``X-Twilio-Signature`` proves Twilio sent them; else 403.
        Without an agent (status callbacks), the environment's credentials are used."""
        name = agent.slug if agent else "-"
        try:
            credentials = twilio_credentials(agent, self._settings)
        except ChannelNotConfigured:
            log.warning("twilio.webhook.rejected agent=%s reason=not_configured", name)
            raise
        signature = request.headers.get(SIGNATURE_HEADER, "")
        form = await request.post()
        reason = None
        if not signature:
            reason = "missing_signature"
        elif any(not isinstance(v, str) for v in form.values()):
            reason = "not_a_form"  # multipart uploads are nothing Twilio sends
        else:
            validator = RequestValidator(credentials.auth_token.get_secret_value())
            url = signed_url(request, self._settings.public_url)
            if not validator.validate(url, form, signature):
                reason = "invalid_signature"
        if reason is not None:
            log.warning(
                "twilio.webhook.rejected agent=%s reason=%s credentials=%s",
                name,
                reason,
                credentials.source,
            )
            raise Forbidden("the request is not signed by Twilio (X-Twilio-Signature)")
        return form


def _twiml() -> web.Response:
    return web.Response(text=EMPTY_TWIML, content_type="text/xml")
