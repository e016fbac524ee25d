"""Tells staff's own systems (PARLEY_NOTIFY_WEBHOOK) who waits for a person: signed JSON.

The events are rows of `core.store.notifications`, so a restart or a receiver that is down
loses none: each is posted until the receiver answers 2xx, with exponential backoff, for at
most ``max_attempts`` tries, and every attempt is recorded. The signature follows Stripe's
and GitHub's: ``X-Parley-Signature: t=<unix time>,v1=<hex HMAC-SHA256 of "<t>.<body>">``.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import logging
import time
from dataclasses import dataclass

import aiohttp

from core.errors import StoreUnavailable
from core.store.notifications import Notification, Notifications

log = logging.getLogger(__name__)

SIGNATURE_HEADER = "X-Parley-Signature"


def sign(secret: str, body: bytes, timestamp: int | None = None) -> str:
    """The signature header's value for ``body`` sent at ``timestamp`` (default: now)."""
    t = int(time.time()) if timestamp is None else timestamp
    mac = hmac.new(secret.encode(), f"{t}.".encode() + body, hashlib.sha256).hexdigest()
    return f"t={t},v1={mac}"


def verify(secret: str, body: bytes, header: str, tolerance: float = 300.0) -> bool:
    """Whether ``header`` signs ``body`` with ``secret``, sent within ``tolerance`` seconds."""
    try:
        parts = dict(p.split("=", 1) for p in header.split(","))
        t = int(parts["t"])
    except (ValueError, KeyError):
        return False
    if abs(time.time() - t) > tolerance:
        return False
    return hmac.compare_digest(sign(secret, body, t), f"t={t},v1={parts.get('v1', '')}")


def payload(item: Notification, console_url: str) -> dict[str, object]:
    return {
        "id": item.id,
        "type": item.type,
        "agent": item.agent,
        "channel": item.channel,
        "conversation_id": item.conversation_id,
        "customer": item.customer,
        "waiting_since": item.waiting_since.isoformat(),
        "console_url": f"{console_url}/admin/conversations/{item.conversation_id}",
    }


@dataclass(frozen=True, slots=True)
class Webhook:
    url: str
    secret: str
    timeout: float = 10.0


class Notifier:
    """One loop: write `conversation.waiting` events for waits grown too long, then post the
    due events to the webhook (or mark them skipped when there is none).

    ``console_url`` is where the console is reached (PARLEY_PUBLIC_URL; "" gives a path).
    """

    def __init__(
        self,
        store: Notifications,
        *,
        webhook: Webhook | None,
        waiting_after: float,
        console_url: str = "",
        poll_interval: float = 5.0,
        backoff_base: float = 30.0,
        backoff_cap: float = 3600.0,
        max_attempts: int = 10,
        lease: float = 60.0,
    ) -> None:
        self._store = store
        self._webhook = webhook
        self._waiting_after = waiting_after
        self._console_url = console_url.rstrip("/")
        self._poll = poll_interval
        self._base = backoff_base
        self._cap = backoff_cap
        self._max = max_attempts
        self._lease = lease

    async def run(self) -> None:
        """Until cancelled; a database that is down pauses the loop, it does not end it."""
        async with aiohttp.ClientSession() as http:
            while True:
                try:
                    await self.once(http)
                except (OSError, TimeoutError, StoreUnavailable) as exc:
                    log.warning("notify.poll.failed error=%r", exc)
                await asyncio.sleep(self._poll)

    async def once(self, http: aiohttp.ClientSession) -> int:
        """One round; returns how many deliveries were attempted."""
        await self._store.record_waiting(self._waiting_after)
        if self._webhook is None:
            await self._store.skip_due()
            return 0
        claimed = await self._store.claim(self._lease)
        await asyncio.gather(*(self._send(http, self._webhook, item) for item in claimed))
        return len(claimed)

    def _retry_in(self, attempts: int) -> float | None:
        if attempts >= self._max:
            return None
        return float(min(self._cap, self._base * 2 ** (attempts - 1)))

    async def _send(self, http: aiohttp.ClientSession, hook: Webhook, item: Notification) -> None:
        body = json.dumps(payload(item, self._console_url)).encode()
        headers = {
            "Content-Type": "application/json",
            SIGNATURE_HEADER: sign(hook.secret, body),
            "User-Agent": "Parley-Notify/1",
        }
        code: int | None = None
        error: str | None = None
        try:
            async with http.post(
                hook.url,
                data=body,
                headers=headers,
                timeout=aiohttp.ClientTimeout(total=hook.timeout),
                allow_redirects=False,
            ) as response:
                code = response.status
                if not 200 <= code < 300:
                    error = f"HTTP {code}"
        except (aiohttp.ClientError, TimeoutError) as exc:
            error = type(exc).__name__
        retry_in = None if error is None else self._retry_in(item.attempts)
        await self._store.record_attempt(item, status_code=code, error=error, retry_in=retry_in)
        if error is None:
            log.info("notify.delivered id=%d type=%s", item.id, item.type)
        else:
            log.warning(
                "notify.failed id=%d attempts=%d error=%s retry_in=%s",
                item.id,
                item.attempts,
                error,
                retry_in,
            )
