"""Sends WhatsApp replies through Twilio's Messages API, split at 1600 characters a part."""

from __future__ import annotations

import asyncio
import contextvars
import logging
from typing import Any

import aiohttp
from twilio.base.exceptions import TwilioRestException, TwilioServiceException
from twilio.http.async_http_client import AsyncTwilioHttpClient
from twilio.http.response import Response
from twilio.rest import Client

from channels.delivery import DeliveryError, Sent, deliver_parts, parse_retry_after, split_message

log = logging.getLogger(__name__)

TWILIO_API = "https://api.twilio.com"
MAX_BODY_CHARS = 1600

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

# Twilio's exceptions carry no headers: the HTTP client leaves Retry-After here for the send
# that is waiting on it. A per-send dict, so concurrent sends cannot see each other's.
_response_headers: contextvars.ContextVar[dict[str, str] | None] = contextvars.ContextVar(
    "twilio_response_headers", default=None
)


class _RebasedHttpClient(AsyncTwilioHttpClient):  # type: ignore[misc]  # twilio is untyped
    """Twilio's async client, sending to ``api_base`` instead of api.twilio.com.

    twilio-python has no base-URL option, so the URL is rewritten here (that is how tests
    reach the fake server). It also applies a default timeout, which the library leaves
    unlimited, sends the credentials as a header, and remembers the Retry-After header of an
    error response.
    """

    def __init__(self, api_base: str, timeout: float) -> None:
        super().__init__(timeout=timeout)
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
        sink = _response_headers.get()
        if sink is not None and response.headers is not None:
            retry_after = response.headers.get("Retry-After")
            if retry_after is not None:
                sink["Retry-After"] = retry_after
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

    async def send(self, recipient: str, text: str, *, skip: int = 0) -> list[Sent]:
        """Send ``text`` to ``recipient`` (``whatsapp:+E164``) in parts of ≤ 1600 characters."""
        await self.start()
        parts = split_message(text, self.limit)
        return await deliver_parts(parts, lambda part: self._send_part(recipient, part), skip=skip)

    async def _send_part(self, recipient: str, body: str) -> Sent:
        headers: dict[str, str] = {}
        reset = _response_headers.set(headers)
        try:
            async with asyncio.timeout(self._timeout):
                message = await self._client.messages.create_async(
                    to=recipient,
                    from_=self._from,
                    body=body,
                    status_callback=self._status_callback,
                )
        except (TwilioRestException, TwilioServiceException) as exc:
            raise _classify(exc, parse_retry_after(headers.get("Retry-After"))) from exc
        except TimeoutError as exc:
            raise DeliveryError(
                f"no answer from Twilio within {self._timeout:g} s", code="timeout"
            ) from exc
        except (aiohttp.ClientError, OSError) as exc:
            raise DeliveryError(
                f"cannot reach Twilio: {type(exc).__name__}", code="connection"
            ) from exc
        finally:
            _response_headers.reset(reset)
        log.debug("twilio.send.part_sent", extra={"provider_message_id": message.sid})
        return Sent(str(message.sid))


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
