"""Headless Chromium for the browser tests, and the ways a visitor reaches the chat bubble."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
from playwright.async_api import Browser, Locator, Page, async_playwright, expect

# Debian's Chromium; PARLEY_TEST_CHROMIUM names another build (a missing path stands for a
# machine without one).
CHROMIUM = Path(os.environ.get("PARLEY_TEST_CHROMIUM") or "/usr/bin/chromium")
ARTIFACTS = Path(__file__).resolve().parents[1] / "artifacts"


@asynccontextmanager
async def chromium() -> AsyncIterator[Browser]:
    """Debian's Chromium (Playwright's own builds are never downloaded)."""
    if not CHROMIUM.exists():
        pytest.fail(
            f"the browser tests need Debian's Chromium at {CHROMIUM}: "
            "apt-get install chromium (.ci/run installs it)"
        )
    async with async_playwright() as p:
        launched = await p.chromium.launch(
            executable_path=str(CHROMIUM),
            args=["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"],
        )
        yield launched
        await launched.close()


def widget(page: Page) -> Locator:
    return page.locator("parley-chat")


def last_answer(page: Page) -> Locator:
    return page.locator("parley-chat .msg.bot:not(.greeting)").last


async def ask(page: Page, question: str) -> None:
    box = widget(page).get_by_role("textbox")
    await box.fill(question)
    await box.press("Enter")


async def open_chat(page: Page, label: str = "Chat openen") -> None:
    await widget(page).get_by_role("button", name=label).click()
    panel = widget(page).get_by_role("dialog")
    await expect(panel).to_be_visible()
    # The panel slides in; measure it where it comes to rest.
    await panel.evaluate("el => Promise.all(el.getAnimations().map((a) => a.finished))")
