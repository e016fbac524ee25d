"""Wrong secrets from one client address, counted: a budget per address, then `RateLimited`.

A secret (a staff password or admin token, a webhook's shared secret) is guessed by sending
it. Each wrong one spends a token of the sending address's bucket, ``ADDRESS_LIMIT``: 20,
then one more every 30 s; once spent, the address is answered `RateLimited` (429 with
``Retry-After``). Staff sign-in counts a try before checking it and gives it back when it was
right (`gateway.admin.throttle`); a webhook checks first and spends only on a wrong secret
(`channels.telegram`), so the sender who has the secret is never held back. ``client`` is
what tells one sender from another: an IPv4 address, or an IPv6 address's /64
(`gateway.client_address.subscriber`). The buckets live in the cache, and stay in the
process (with the same semantics) while Redis is down.
"""

from __future__ import annotations

from core.errors import RateLimited
from core.ports import BucketResult, Cache

# Wrong secrets from one address: (tokens a second, burst).
ADDRESS_LIMIT = (1 / 30, 20.0)


class WrongSecrets:
    """The budget of wrong ``scope`` secrets (``"admin:sign-in"``) each client address has."""

    def __init__(self, cache: Cache, scope: str) -> None:
        self._cache = cache
        self._scope = scope

    def _key(self, client: str) -> str:
        return f"{self._scope}:address:{client}"

    async def take(self, client: str) -> BucketResult:
        """Spend one of ``client``'s tries; ``allowed`` is False once none is left."""
        rate, burst = ADDRESS_LIMIT
        return await self._cache.take_token(self._key(client), rate=rate, capacity=burst)

    async def give_back(self, client: str) -> None:
        """Return a try `take` spent (it was right after all, or was not made)."""
        rate, burst = ADDRESS_LIMIT
        await self._cache.take_token(self._key(client), rate=rate, capacity=burst, cost=-1)

    async def failed(self, client: str, message: str) -> None:
        """Count a wrong secret from ``client``; `RateLimited` (with ``message``) once the
        address has sent more than its budget."""
        spent = await self.take(client)
        if not spent.allowed:
            raise RateLimited(message, spent.retry_after)
