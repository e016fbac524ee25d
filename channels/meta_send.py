"""Sends WhatsApp replies through Meta's Cloud API (the Graph API), 4096 characters a part.

One `MetaSender` per business phone number: text parts, approved templates (outside the
24-hour window) and the read receipt with its typing indicator, all ``POST
{base}/{version}/{phone_number_id}/messages`` with the access token as a Bearer header.
The token is never put in a log line, an error message or a repr.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import aiohttp

from channels.delivery import keep_typing, parse_retry_after
from core.delivery import DeliveryError, Sent, Template, too_long

log = logging.getLogger(__name__)

GRAPH_API = "https://graph.facebook.com"
GRAPH_VERSION = "v21.0"
MAX_TEXT_CHARS = 4096
# Meta shows the typing indicator for up to 25 s, or until the reply arrives.
TYPING_INTERVAL = 20.0
# A typing indicator is a courtesy that is repeated anyway: it never waits long.
TYPING_TIMEOUT = 5.0

# Meta's error codes (developers.facebook.com/docs/whatsapp/cloud-api/support/error-codes)
# that no retry can fix.
PERMANENT_CODES = frozenset(
    {
        0,  # AuthException: the token could not be verified
        3,  # the app lacks the capability
        10,  # permission denied
        100,  # invalid parameter
        190,  # access token expired or invalid
        200,  # permission not granted
        368,  # temporarily blocked for policy violations (days, not seconds)
        131008,  # a required parameter is missing
        131009,  # a parameter value is invalid
        131021,  # recipient and sender are the same number
        131026,  # undeliverable: not on WhatsApp, old app, terms not accepted
        131030,  # recipient not in the allowed list (test numbers)
        131031,  # business account locked
        131042,  # payment problem on the business account
        131045,  # phone number not registered correctly
        131047,  # re-engagement: more than 24 hours since the customer wrote; a template is needed
        131051,  # unsupported message type
        132000,  # template: wrong number of parameters
        132001,  # template does not exist (in that language)
        132005,  # template: text too long once filled in
        132007,  # template: format against policy
        132012,  # template: parameter format mismatch
        132015,  # template paused
        132016,  # template disabled
        133010,  # phone number not registered on the Cloud API
    }
)
# Throttling: try again later, after Retry-After when Meta sends one.
RATE_LIMIT_CODES = frozenset(
    {
        4,  # application request limit
        80007,  # WhatsApp business account rate limit
        130429,  # Cloud API throughput reached
        131048,  # spam rate limit
        131056,  # too many messages to one customer in a short time (pair rate limit)
    }
)
# Meta's own trouble, answered with a 4xx or 5xx alike: worth another attempt.
TRANSIENT_CODES = frozenset({1, 2, 131000, 131016, 133004})


@dataclass
class _Call:
    """What aiohttp saw of one request: whether it went out (a timeout after that may hide
    a message Meta accepted)."""

    request_sent: bool = False


async def _on_request_sent(
    session: aiohttp.ClientSession,
    context: SimpleNamespace,
    params: aiohttp.TraceRequestHeadersSentParams,
) -> None:
    call = context.trace_request_ctx
    if isinstance(call, _Call):
        call.request_sent = True


def _tracing() -> aiohttp.TraceConfig:
    config = aiohttp.TraceConfig()
    config.on_request_headers_sent.append(_on_request_sent)
    return config


class MetaSender:
    """Sends to WhatsApp customers from one business phone number of Meta's Cloud API.

    The HTTP session is built inside the running loop on first use and closed by `close`.
    """

    limit = MAX_TEXT_CHARS

    def __init__(
        self,
        access_token: str,
        phone_number_id: str,
        *,
        api_base: str = GRAPH_API,
        api_version: str = GRAPH_VERSION,
        timeout: float = 15.0,
        typing_interval: float = TYPING_INTERVAL,
    ) -> None:
        self._token = access_token
        self._phone_number_id = phone_number_id
        self._api_base = api_base.rstrip("/")
        self._api_version = api_version
        self._timeout = timeout
        self._typing_interval = typing_interval
        self._http: aiohttp.ClientSession | None = None

    def __repr__(self) -> str:
        return (
            f"MetaSender(phone_number_id={self._phone_number_id!r}, "
            f"api_base={self._api_base!r}, api_version={self._api_version!r})"
        )

    @property
    def _messages_url(self) -> str:
        return f"{self._api_base}/{self._api_version}/{self._phone_number_id}/messages"

    async def start(self) -> None:
        """Build the HTTP session in the running loop; every call does it when needed."""
        if self._http is None:
            self._http = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=self._timeout),
                trace_configs=[_tracing()],
                raise_for_status=False,
            )

    async def close(self) -> None:
        http, self._http = self._http, None
        if http is not None:
            await http.close()

    async def send(self, recipient: str, text: str) -> Sent:
        """Send one part (≤ 4096 characters) to ``recipient`` (the customer's WhatsApp id)."""
        if len(text) > self.limit:
            raise too_long(text, self.limit)
        body = {
            **_to(recipient),
            "type": "text",
            "text": {"body": text, "preview_url": True},
        }
        return _sent(await self._post(body, timeout=self._timeout))

    async def send_template(
        self, recipient: str, template: Template, values: Sequence[str]
    ) -> Sent:
        """Send an approved template (the only thing allowed outside the 24-hour window),
        its ``{{n}}`` placeholders filled with ``values`` in order."""
        content: dict[str, Any] = {
            "name": template.provider_id,
            "language": {"code": template.language},
        }
        if values:
            parameters = [{"type": "text", "text": value} for value in values]
            content["components"] = [{"type": "body", "parameters": parameters}]
        body = {**_to(recipient), "type": "template", "template": content}
        return _sent(await self._post(body, timeout=self._timeout))

    async def mark_read(self, message_id: str, *, typing: bool = True) -> None:
        """Mark the customer's message read and, with ``typing``, show "typing..." (for up to
        25 s, or until the reply arrives)."""
        body: dict[str, Any] = {
            "messaging_product": "whatsapp",
            "status": "read",
            "message_id": message_id,
        }
        if typing:
            body["typing_indicator"] = {"type": "text"}
        await self._post(body, timeout=min(TYPING_TIMEOUT, self._timeout))

    async def check(self) -> str:
        """The sending number as the Graph API knows it (its display number and verified
        name), read with the access token: `parley doctor` asks. Refusals and silences are
        `DeliveryError`s."""
        await self.start()
        assert self._http is not None
        url = f"{self._api_base}/{self._api_version}/{self._phone_number_id}"
        try:
            async with self._http.get(
                url,
                params={"fields": "display_phone_number,verified_name"},
                headers={"Authorization": f"Bearer {self._token}"},
            ) as response:
                answer = await _json(response)
                if response.status >= 400:
                    raise self._refused(response, answer)
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            raise _unanswered(exc, self._timeout, sent=False) from None
        number = answer.get("display_phone_number") or self._phone_number_id
        name = answer.get("verified_name")
        return f"number {number}" + (f" ({name})" if name else "")

    async def keep_typing(
        self, recipient: str, message_id: str | None, until: asyncio.Event
    ) -> None:
        """Show "typing..." until ``until`` is set, renewed every 20 s; failures are logged,
        a permanent one ends it. Meta ties the indicator to the message being answered:
        without its id there is nothing to show."""
        if not message_id:
            log.debug("meta.typing.skipped reason=no_message_id")
            return
        await keep_typing(lambda: self.mark_read(message_id), until, interval=self._typing_interval)

    async def _post(self, body: Mapping[str, Any], *, timeout: float) -> dict[str, Any]:  # noqa: ASYNC109
        await self.start()
        assert self._http is not None
        call = _Call()
        try:
            async with self._http.post(
                self._messages_url,
                json=body,
                headers={"Authorization": f"Bearer {self._token}"},
                timeout=aiohttp.ClientTimeout(total=timeout),
                trace_request_ctx=call,
            ) as response:
                answer = await _json(response)
                if response.status >= 400:
                    raise self._refused(response, answer)
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            raise _unanswered(exc, timeout, sent=call.request_sent) from None
        return answer

    def _refused(self, response: aiohttp.ClientResponse, answer: dict[str, Any]) -> DeliveryError:
        error = answer.get("error")
        error = error if isinstance(error, dict) else {}
        code = error.get("code")
        code = code if isinstance(code, int) and not isinstance(code, bool) else None
        message = str(error.get("message") or response.reason or "error")
        # Meta's messages do not quote the token; this makes sure of it.
        message = message.replace(self._token, "<token>")[:500]
        status = response.status
        if code in RATE_LIMIT_CODES or status == 429:
            permanent = False
        elif code in PERMANENT_CODES:
            permanent = True
        elif code in TRANSIENT_CODES or status >= 500:
            permanent = False
        else:
            permanent = 400 <= status < 500
        log.info(
            "meta.send.refused status=%d code=%s subcode=%s fbtrace_id=%s permanent=%s",
            status,
            code,
            error.get("error_subcode"),
            error.get("fbtrace_id"),
            permanent,
        )
        return DeliveryError(
            f"Meta answered {status}: {message}",
            code=str(code) if code is not None else f"http_{status}",
            permanent=permanent,
            retry_after=None
            if permanent
            else parse_retry_after(response.headers.get("Retry-After")),
        )


def _to(recipient: str) -> dict[str, str]:
    return {"messaging_product": "whatsapp", "recipient_type": "individual", "to": recipient}


async def _json(response: aiohttp.ClientResponse) -> dict[str, Any]:
    """The answer's JSON object; {} for anything else (a proxy's HTML error page)."""
    try:
        data = await response.json(content_type=None)
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}


def _sent(answer: dict[str, Any]) -> Sent:
    messages = answer.get("messages")
    first = messages[0] if isinstance(messages, list) and messages else None
    wamid = first.get("id") if isinstance(first, dict) else None
    if not isinstance(wamid, str) or not wamid:
        # Meta said yes without saying to what: it may well have the message.
        raise DeliveryError(
            "Meta accepted the message without a message id", code="no_message_id", ambiguous=True
        )
    log.debug("meta.send.part_sent", extra={"provider_message_id": wamid})
    return Sent(wamid)


def _unanswered(exc: BaseException, timeout: float, *, sent: bool) -> DeliveryError:
    """A call that got no answer. Once the request went out, Meta may have accepted the
    message and only its answer was lost: that is ambiguous."""
    if isinstance(exc, TimeoutError):  # aiohttp's own timeouts are TimeoutErrors too
        message, code = f"no answer from Meta within {timeout:g} s", "timeout"
    else:
        message, code = f"cannot reach Meta: {type(exc).__name__}", "connection"
    if sent:
        message += " (the request went out: Meta may have accepted it)"
    return DeliveryError(message, code=code, ambiguous=sent)
