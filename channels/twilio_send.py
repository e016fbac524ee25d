"""Sends WhatsApp replies (1600 characters a part) and approved templates through Twilio."""

from __future__ import annotations

import asyncio
import contextvars
import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace
from typing import Any

import aiohttp
from twilio.base.exceptions import TwilioException, TwilioRestException, TwilioServiceException
from twilio.http.async_http_client import AsyncTwilioHttpClient
from twilio.http.response import Response
from twilio.rest import Client

from channels.delivery import parse_retry_after
from core.delivery import DeliveryError, Sent, Template, too_long

log = logging.getLogger(__name__)

TWILIO_API = "https://api.twilio.com"
MAX_BODY_CHARS = 1600
# How far before an attempt's start a message found by a look-up may have been created: our
# clock and Twilio's differ a little, and Twilio's dates are whole seconds.
CLOCK_MARGIN = timedelta(seconds=60)
# Messages a look-up reads at most (newest first). One chat's parts are sent one at a time,
# so the one looked for is among the newest few sent to that customer since the attempt.
LOOKUP_LIMIT = 200
LOOKUP_PAGE_SIZE = 50

# Twilio error codes that no retry can fix.
PERMANENT_CODES = frozenset(
    {
        21211,  # invalid 'To' number
        21610,  # recipient unsubscribed (replied STOP)
        21614,  # 'To' is not a valid mobile number
        21617,  # body too long
        63016,  # outside WhatsApp's 24-hour window: a template is needed
    }
)


@dataclass
class _Exchange:
    """What the HTTP client saw of one call, for the code waiting on it: whether the request
    went out (a timeout after that may hide an accepted message) and, since Twilio's
    exceptions carry no headers, the Retry-After of an error answer."""

    request_sent: bool = False
    retry_after: str | None = None


# One per call, so concurrent sends cannot see each other's.
_exchange: contextvars.ContextVar[_Exchange | None] = contextvars.ContextVar(
    "twilio_exchange", default=None
)


async def _on_request_sent(
    session: aiohttp.ClientSession,
    context: SimpleNamespace,
    params: aiohttp.TraceRequestHeadersSentParams,
) -> None:
    exchange = _exchange.get()
    if exchange is not None:
        exchange.request_sent = True


def _tracing() -> aiohttp.TraceConfig:
    config = aiohttp.TraceConfig()
    config.on_request_headers_sent.append(_on_request_sent)
    return config


class _RebasedHttpClient(AsyncTwilioHttpClient):  # type: ignore[misc]  # twilio is untyped
    """Twilio's async client, sending to ``api_base`` instead of api.twilio.com.

    twilio-python has no base-URL option, so the URL is rewritten here (that is how tests
    reach the fake server). It also applies a default timeout, which the library leaves
    unlimited, sends the credentials as a header, and notes for the waiting call whether its
    request went out and the Retry-After header of an error response.
    """

    def __init__(self, api_base: str, timeout: float) -> None:
        super().__init__(timeout=timeout, trace_configs=[_tracing()])
        self._api_base = api_base.rstrip("/")

    async def request(
        self,
        method: str,
        url: str,
        params: dict[str, object] | None = None,
        data: dict[str, object] | None = None,
        headers: dict[str, str] | None = None,
        auth: tuple[str, str] | None = None,
        timeout: float | None = None,  # noqa: ASYNC109  (the library's signature)
        allow_redirects: bool = False,
    ) -> Response:
        if url.startswith(TWILIO_API):
            url = self._api_base + url[len(TWILIO_API) :]
        if auth is not None:
            # The library would pass aiohttp.BasicAuth, deprecated in aiohttp 3.14. Its request
            # log leaves out headers named Authorization, so the token stays out of logs.
            headers = {**(headers or {}), "Authorization": aiohttp.encode_basic_auth(*auth)}
        response: Response = await super().request(
            method,
            url,
            params=params,
            data=data,
            headers=headers,
            auth=None,
            timeout=timeout if timeout is not None else self.timeout,
            allow_redirects=allow_redirects,
        )
        exchange = _exchange.get()
        if exchange is not None and response.headers is not None:
            exchange.retry_after = response.headers.get("Retry-After")
        return response


class TwilioSender:
    """Sends text to one WhatsApp (or SMS) number from ``from_number``, part by part.

    The Twilio client holds an aiohttp session, so it is built inside the running loop on
    first use (or by `start`) and must be closed with `close`.
    """

    limit = MAX_BODY_CHARS

    def __init__(
        self,
        account_sid: str,
        auth_token: str,
        from_number: str,
        *,
        api_base: str = TWILIO_API,
        status_callback: str | None = None,
        timeout: float = 15.0,
    ) -> None:
        self._account_sid = account_sid
        self._auth_token = auth_token
        self._from = from_number
        self._api_base = api_base
        self._status_callback = status_callback
        self._timeout = timeout
        self._client: Any = None
        self._http: _RebasedHttpClient | None = None

    def __repr__(self) -> str:
        return f"TwilioSender(account_sid={self._account_sid!r}, api_base={self._api_base!r})"

    async def start(self) -> None:
        """Build the client in the running loop; `send` does it too when needed."""
        if self._client is None:
            self._http = _RebasedHttpClient(self._api_base, self._timeout)
            client = Client(self._account_sid, self._auth_token, http_client=self._http)
            if self._api_base.rstrip("/") != TWILIO_API:
                # TWILIO_EDGE / TWILIO_REGION would rename the host before it can be rewritten.
                client.edge = None
                client.region = None
            self._client = client

    async def close(self) -> None:
        http, self._http, self._client = self._http, None, None
        if http is not None:
            await http.close()

    async def send(self, recipient: str, text: str) -> Sent:
        """Send one part (≤ 1600 characters) to ``recipient`` (``whatsapp:+E164``)."""
        if len(text) > self.limit:
            raise too_long(text, self.limit)
        await self.start()
        return await self._create(recipient, body=text)

    async def send_template(
        self, recipient: str, template: Template, values: Sequence[str]
    ) -> Sent:
        """Send an approved template (the only thing WhatsApp delivers outside the 24-hour
        window): its Content SID, with ``values`` as the Content API's numbered variables
        (``{"1": ..., "2": ...}``); Twilio fills them in."""
        variables = {str(number): value for number, value in enumerate(values, start=1)}
        await self.start()
        return await self._create(
            recipient,
            content_sid=template.provider_id,
            content_variables=json.dumps(variables, ensure_ascii=False),
        )

    async def find_sent(self, recipient: str, text: str, since: datetime) -> list[Sent]:
        """Messages with body ``text`` that Twilio accepted for ``recipient`` from this sender
        since ``since``, oldest first: what became of a part whose answer never came.

        Asks Twilio's Messages list, filtered by To, From and send date (whole days, as
        Twilio's filter takes them), and matches the body and creation time here. A message
        Twilio accepted but has not sent yet has no send date and is not found.
        """
        await self.start()
        earliest = since.astimezone(UTC) - CLOCK_MARGIN
        wanted = _normal_body(text)
        exchange = _Exchange()
        reset = _exchange.set(exchange)
        try:
            async with asyncio.timeout(self._timeout):
                messages = await self._client.messages.list_async(
                    to=recipient,
                    from_=self._from,
                    date_sent_after=earliest.strftime("%Y-%m-%d"),
                    limit=LOOKUP_LIMIT,
                    page_size=LOOKUP_PAGE_SIZE,
                )
        except TwilioException as exc:
            raise _lookup_failed(exc, parse_retry_after(exchange.retry_after)) from exc
        except TimeoutError as exc:
            raise DeliveryError(
                f"Twilio look-up: no answer within {self._timeout:g} s", code="timeout"
            ) from exc
        except (aiohttp.ClientError, OSError) as exc:
            raise DeliveryError(
                f"Twilio look-up: cannot reach Twilio: {type(exc).__name__}", code="connection"
            ) from exc
        finally:
            _exchange.reset(reset)
        found = [
            m
            for m in messages
            if m.to == recipient
            and m.from_ == self._from
            and not str(m.direction or "").startswith("inbound")
            and m.date_created is not None
            and m.date_created >= earliest
            and _normal_body(m.body) == wanted
        ]
        found.sort(key=lambda m: m.date_created)
        log.debug("twilio.lookup.done", extra={"read": len(messages), "found": len(found)})
        return [Sent(str(m.sid), status=None if m.status is None else str(m.status)) for m in found]

    async def check(self) -> str:
        """Who the credentials belong to, as Twilio says (the account's name and status):
        `parley doctor` asks. Refusals and silences are `DeliveryError`s."""
        await self.start()
        try:
            async with asyncio.timeout(self._timeout):
                account = await self._client.api.v2010.accounts(self._account_sid).fetch_async()
        except TwilioRestException as exc:
            raise DeliveryError(
                f"Twilio answered {exc.status}: {exc.msg}", code=f"http_{exc.status}"
            ) from exc
        except TwilioException as exc:
            raise DeliveryError(f"Twilio refused the look-up: {type(exc).__name__}") from exc
        except TimeoutError as exc:
            raise DeliveryError(f"no answer from Twilio within {self._timeout:g} s") from exc
        except (aiohttp.ClientError, OSError) as exc:
            raise DeliveryError(f"cannot reach Twilio: {type(exc).__name__}") from exc
        return f"account {account.friendly_name!r} ({account.status})"

    async def _create(self, recipient: str, **content: str) -> Sent:
        """One message to ``recipient``: ``body``, or ``content_sid`` with its
        ``content_variables``; Twilio's refusals and silences as `DeliveryError`s."""
        exchange = _Exchange()
        reset = _exchange.set(exchange)
        try:
            async with asyncio.timeout(self._timeout):
                message = await self._client.messages.create_async(
                    to=recipient,
                    from_=self._from,
                    status_callback=self._status_callback,
                    **content,
                )
        except (TwilioRestException, TwilioServiceException) as exc:
            raise _classify(exc, parse_retry_after(exchange.retry_after)) from exc
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            raise _unanswered(exc, self._timeout, sent=exchange.request_sent) from exc
        finally:
            _exchange.reset(reset)
        log.debug("twilio.send.part_sent", extra={"provider_message_id": message.sid})
        return Sent(str(message.sid))


def _normal_body(body: object) -> str:
    # Twilio keeps the body as sent; our parts lose surrounding whitespace when split.
    return str(body or "").replace("\r\n", "\n").strip()


def _unanswered(exc: BaseException, timeout: float, *, sent: bool) -> DeliveryError:
    """A call that got no answer. Once the request went out, Twilio may have accepted the
    message and only its answer was lost: that is ambiguous, and a look-up settles it."""
    if isinstance(exc, TimeoutError):  # aiohttp's own timeouts are TimeoutErrors too
        message, code = f"no answer from Twilio within {timeout:g} s", "timeout"
    else:
        message, code = f"cannot reach Twilio: {type(exc).__name__}", "connection"
    if sent:
        message += " (the request went out: Twilio may have accepted it)"
    return DeliveryError(message, code=code, ambiguous=sent)


def _lookup_failed(exc: TwilioException, retry_after: float | None) -> DeliveryError:
    # The list call raises the library's base exception with the HTTP response attached.
    response = exc.args[1] if len(exc.args) > 1 else None
    status = getattr(response, "status_code", None) or getattr(exc, "status", None)
    if not isinstance(status, int):
        return DeliveryError(f"Twilio look-up failed: {exc}", code="lookup_failed")
    permanent = 400 <= status < 500 and status != 429
    return DeliveryError(
        f"Twilio look-up answered {status}",
        code=f"lookup_{status}",
        permanent=permanent,
        retry_after=None if permanent else retry_after,
    )


def _classify(
    exc: TwilioRestException | TwilioServiceException, retry_after: float | None
) -> DeliveryError:
    status = int(exc.status)
    code = None if exc.code is None else int(exc.code)
    if isinstance(exc, TwilioServiceException):
        message = f"{exc.title}: {exc.detail}" if exc.detail else str(exc.title)
    else:
        message = str(exc.msg)
    permanent = code in PERMANENT_CODES or (400 <= status < 500 and status != 429)
    return DeliveryError(
        f"Twilio answered {status}: {message}",
        code=None if code is None else str(code),
        permanent=permanent,
        retry_after=retry_after if not permanent else None,
    )
