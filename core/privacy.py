"""Privacy requests: erase a customer everywhere Parley keeps them, or export what it keeps."""

from __future__ import annotations

import logging
from typing import Protocol

from core.store.privacy import Customer, Erasure, Privacy

log = logging.getLogger(__name__)


class Forgetful(Protocol):
    """The bot's memory of a conversation (`core.memory.ConversationMemory` fits)."""

    async def forget(self, conversation_id: int) -> None: ...


class CustomerData:
    """One customer's data, by agent, channel and the channel's own id of them.

    Postgres is erased in one transaction (`core.store.privacy`); the cached memory of each
    conversation goes after it, through the memory's own ``forget``. Nothing else of the
    customer is cached: the retrieval and answer caches hold questions of no one in
    particular, and the rewrite cache's entries are hashes that expire within hours.
    """

    def __init__(self, privacy: Privacy, memory: Forgetful) -> None:
        self._privacy = privacy
        self._memory = memory
        # Exporting and reading the audit touch Postgres alone: the store's own, as they are.
        self.export = privacy.export
        self.audit = privacy.audit

    async def erase(self, customer: Customer, *, staff: str) -> Erasure:
        erasure = await self._privacy.erase(customer, staff=staff)
        for conversation_id in erasure.conversation_ids:
            await self._memory.forget(conversation_id)
        # The hash, never the id: the log says a request was done, not whose.
        log.info(
            "privacy.erased agent=%s channel=%s customer=%s rows=%d",
            customer.agent,
            customer.channel,
            erasure.customer_hash[:12],
            erasure.erased.total,
        )
        return erasure
