"""Guessing staff credentials, slowed down: back-off per account and client, a budget per address.

What is slowed is failing, never the owner of an account:

- each (account, address) pair gets ``FREE_FAILURES`` tries in a row; after that each further
  try waits, 1 s after the fifth failure and twice as long after each next one, up to
  ``LONGEST_WAIT``. Nobody else's failures, from other addresses, make an owner wait, so an
  account cannot be locked by guessing at it;
- each address may fail ``ADDRESS_LIMIT`` (`core.wrong_secrets`, the budget wrong webhook
  secrets spend too) across all accounts, against one address trying a few passwords on
  each of many accounts;
- a browser that has signed in to the account before (its device cookie,
  `core.store.staff.StaffAccounts.device_owner`) is counted on its own instead: its own
  failures back off as a pair's do, and nobody else's count, so a guesser behind the owner's
  address (an office, a NAT, a proxy) does not keep the owner out either;
- a success clears its pair's failures and gives its try back to the address.

A try is counted before the credentials are checked (and uncounted when it succeeds), so
that requests sent all at once cannot each find the count below the limit; a try refused
here is refused unread, so a refusal says nothing of whether the password was right. The
state lives in the cache: counters and token buckets only, which stay in the process (with
the same semantics) while Redis is down.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from core.errors import RateLimited
from core.ports import Cache
from core.wrong_secrets import WrongSecrets
from gateway.client_address import subscriber

log = logging.getLogger(__name__)

FREE_FAILURES = 5
FIRST_WAIT = 1.0  # seconds, after the FREE_FAILURES-th failure in a row
LONGEST_WAIT = 15 * 60.0
FORGET_AFTER = 24 * 3600.0  # a pair's failures are forgotten this long after the first


def wait_before(attempt: int) -> float:
    """Seconds the ``attempt``-th try in a row must wait after the one before it."""
    over = attempt - FREE_FAILURES - 1
    return 0.0 if over < 0 else min(LONGEST_WAIT, FIRST_WAIT * 2.0 ** min(over, 32))


@dataclass(frozen=True, slots=True)
class Attempt:
    """One admitted try at signing in, counted as failed until `SignInThrottle.succeeded`."""

    account: str
    address: str
    number: int  # its place in the pair's tries since the last success
    device: str | None = None  # the browser's device nonce, when it signed in here before


class SignInThrottle:
    """Admits tries at a staff account's credentials, or says how long to wait."""

    def __init__(self, cache: Cache) -> None:
        self._cache = cache
        self._addresses = WrongSecrets(cache, "admin:sign-in")

    @staticmethod
    def _keys(account: str, address: str, device: str | None) -> tuple[str, str, str | None]:
        """The pair's counter and gate, and the client whose budget the try spends (None for
        a known device)."""
        if device is not None:
            pair = f"admin:sign-in:backoff:{account}:device:{device}"
            return pair, pair + ":gate", None
        client = subscriber(address)
        pair = f"admin:sign-in:backoff:{account}:{client}"
        return pair, pair + ":gate", client

    async def begin(self, account: str, address: str, device: str | None = None) -> Attempt:
        """Admit a try at ``account``'s credentials from ``address``, or raise `RateLimited`.

        ``account`` is what is being guessed: a normalised email address, or ``"token"``.
        ``device`` is the nonce of the browser's device token when it was made for this
        account: the try is then counted for that browser alone.
        """
        count, gate, client = self._keys(account, address, device)
        if client is not None:
            spent = await self._addresses.take(client)
            if not spent.allowed:
                log.info("admin.sign_in.throttled scope=address address=%s", address)
                raise RateLimited("too many failed sign-ins; try again later", spent.retry_after)
        number = await self._cache.incr(count, ttl=FORGET_AFTER)
        if number >= FREE_FAILURES:
            wait = wait_before(number)
            if wait > 0:
                # Allowed once the wait since the last admitted try has passed.
                opened = await self._cache.take_token(gate, rate=1 / wait, capacity=1.0)
                if not opened.allowed:
                    await self._cache.incr(count, -1)
                    if client is not None:
                        await self._addresses.give_back(client)
                    log.info(
                        "admin.sign_in.throttled scope=%s address=%s",
                        "account" if device is None else "device",
                        address,
                    )
                    raise RateLimited(
                        "too many failed sign-ins; try again later", opened.retry_after
                    )
            # Start the next wait now. The bucket is rated for the next try's wait, so that
            # it is kept (a bucket expires once it would be full) until that wait is over.
            await self._cache.take_token(
                gate, rate=1 / wait_before(number + 1), capacity=1.0, cost=1.0 if wait == 0 else 0
            )
        return Attempt(account, address, number, device)

    async def succeeded(self, attempt: Attempt) -> None:
        """The credentials were right: the pair starts afresh, the address gets its try back."""
        count, gate, client = self._keys(attempt.account, attempt.address, attempt.device)
        await self._cache.delete(count, gate)
        if client is not None:
            await self._addresses.give_back(client)
