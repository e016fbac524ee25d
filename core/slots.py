"""Work slots: how many turns of one process do their own work (CPU, database) at once.

A messaging turn does some work itself (embedding the question, searching, quoting the
sources, saving) and spends most of its time waiting for the language model. The work is
bounded by a few slots, so that the cores are never asked to interleave dozens of turns'
work (each would take that many times longer) and the database pool stays free for the
webhooks. While a turn waits on the network it gives its slot back (`network_wait`), so a
slow model costs no slot and many turns can wait on it at once. A turn coming back from
the network gets the next free slot before any new turn may start (`WorkSlots.try_take`
refuses while one waits), so turns already begun finish first.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from contextvars import ContextVar


class WorkSlots:
    """``size`` slots, handed out in the order they were asked for; ``on_free`` is called
    whenever a slot becomes free (none is waiting for it). While ``defer`` says so, work more
    urgent than a new turn is waiting in the process (webhooks to acknowledge): `try_take`
    gives no slot then, and turns already begun go on."""

    def __init__(
        self,
        size: int,
        *,
        on_free: Callable[[], None] | None = None,
        defer: Callable[[], bool] | None = None,
    ) -> None:
        if size < 1:
            raise ValueError("at least one work slot is needed")
        self.size = size
        self._free = size
        self._waiters: deque[asyncio.Future[None]] = deque()
        self._on_free = on_free
        self._defer = defer

    @property
    def in_use(self) -> int:
        return self.size - self._free

    @property
    def waiting(self) -> int:
        """Turns waiting for a slot (coming back from the network, or started by hand)."""
        return sum(1 for w in self._waiters if not w.done())

    def try_take(self) -> Slot | None:
        """A slot now; None when all are taken, a turn is waiting for one (it goes first) or
        the process has more urgent work."""
        if self._free == 0 or self.waiting or (self._defer is not None and self._defer()):
            return None
        self._free -= 1
        return Slot(self)

    async def take(self) -> Slot:
        """A slot, waiting for one if need be."""
        await self._acquire()
        return Slot(self)

    async def _acquire(self) -> None:
        if self._free > 0 and not self.waiting:
            self._free -= 1
            return
        waiter = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                self._release()  # handed a slot just as it was cancelled: pass it on
            raise
        finally:
            if waiter in self._waiters:
                self._waiters.remove(waiter)

    def _release(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)  # the slot passes straight to the first waiter
                return
        self._free += 1
        if self._on_free is not None:
            self._on_free()


class Slot:
    """One turn's hold on a work slot."""

    def __init__(self, slots: WorkSlots) -> None:
        self._slots = slots
        self.held = True

    def give_back(self) -> None:
        """Let another turn work; idempotent."""
        if self.held:
            self.held = False
            self._slots._release()

    async def take_back(self) -> None:
        if not self.held:
            await self._slots._acquire()
            self.held = True


# The slot of the turn the current task works on, with that task: a task the turn starts
# inherits the variable, but only the turn's own task may give the slot back.
_CURRENT: ContextVar[tuple[Slot, asyncio.Task[object] | None] | None] = ContextVar(
    "work_slot", default=None
)


@contextmanager
def working_in(slot: Slot) -> Iterator[Slot]:
    """The block is the slot's turn: `network_wait` inside it gives the slot back for the
    wait. The slot is released when the block ends."""
    token = _CURRENT.set((slot, asyncio.current_task()))
    try:
        yield slot
    finally:
        _CURRENT.reset(token)
        slot.give_back()


@asynccontextmanager
async def network_wait() -> AsyncIterator[None]:
    """The current turn waits on the network (the model): its work slot, if it holds one, is
    given back for the wait and taken again after it (unless the turn was cancelled)."""
    bound = _CURRENT.get()
    if bound is None or bound[1] is not asyncio.current_task() or not bound[0].held:
        yield
        return
    slot = bound[0]
    slot.give_back()
    cancelled = False
    try:
        yield
    except asyncio.CancelledError:
        cancelled = True
        raise
    finally:
        if not cancelled:
            await slot.take_back()
