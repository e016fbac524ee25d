"""Webhooks first: how far behind the acknowledgements are, for the workers of the same process.

`parley serve` answers WhatsApp and Telegram in the process that acknowledges their webhooks,
on the same event loop and cores. A provider re-delivers what is not acknowledged in time
(Twilio gives up after 15 s) while every turn can wait a moment, so the acknowledgements come
first: while a webhook has been in the gateway longer than `PATIENCE`, the in-process workers
start no new turn (`core.slots.WorkSlots`); turns already begun carry on. A webhook normally
takes a few milliseconds, so this happens only when the process is short of CPU or database
for both. `parley worker` has no webhooks: its gauge is never behind.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator
from contextlib import contextmanager

# How long a webhook may wait before the workers hold back new turns.
PATIENCE = 0.010


class IntakeGauge:
    """The webhooks in flight, oldest first."""

    def __init__(self, patience: float = PATIENCE) -> None:
        self._patience = patience
        self._started: dict[int, float] = {}  # in arrival order
        self._numbers = itertools.count()

    def behind(self) -> bool:
        """Whether a webhook in flight has waited longer than the patience allows."""
        for started in self._started.values():  # the oldest first
            return time.monotonic() - started > self._patience
        return False

    @contextmanager
    def arrived(self) -> Iterator[None]:
        """The block is one webhook in flight."""
        number = next(self._numbers)
        self._started[number] = time.monotonic()
        try:
            yield
        finally:
            del self._started[number]
