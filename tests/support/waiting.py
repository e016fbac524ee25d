"""Waiting in a test for something another task or process brings about."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable


async def wait_until(check: Callable[[], Awaitable[bool]], timeout: float = 20.0) -> None:
    """Poll ``check`` until it holds; fail after ``timeout`` seconds."""
    async with asyncio.timeout(timeout):
        while not await check():
            await asyncio.sleep(0.05)
