"""A visitor rates answers in the demo shop's widget: thumbs, a comment, a changed mind."""

from __future__ import annotations

from pathlib import Path

from playwright.async_api import Browser, Page, expect

from gateway.keys import DATABASE
from tests.e2e.browser import ask, last_answer, open_chat, widget
from tests.e2e.conftest import FakeLlm, StartGateway
from tests.e2e.test_widget_layout import (
    LAYOUT_PROBLEMS,
    QUESTIONS,
    SHOP_PAGE,
    add_help_pages,
    respond,
    unlimited_questions,
)

COMMENT = "I wanted to know about delivery to Luxembourg."


async def no_layout_problems(page: Page) -> None:
    problems: list[str] = await page.evaluate(LAYOUT_PROBLEMS)
    assert problems == [], "\n".join(problems)


async def test_a_visitor_gives_a_thumbs_down_with_a_comment(
    browser: Browser,
    start_gateway: StartGateway,
    llm: FakeLlm,
    demo_copy: str,
    tmp_path: Path,
) -> None:
    await unlimited_questions(demo_copy)
    llm.fake.responder = respond
    gateway = await start_gateway(with_llm=True)
    await add_help_pages(gateway, tmp_path)
    pool = gateway.app[DATABASE].pool
    page = await browser.new_page(viewport={"width": 1280, "height": 800})
    await page.goto(gateway.url + SHOP_PAGE)
    await open_chat(page, "Open chat")
    chat = widget(page)
    for question in QUESTIONS[:3]:
        await ask(page, question)
        await expect(last_answer(page)).to_have_attribute("data-state", "done")
    answers = chat.locator(".msg.bot:not(.greeting)")
    await expect(answers.get_by_role("group", name="Was this answer helpful?")).to_have_count(3)

    # A thumbs up on the first answer, then a change of mind.
    first = answers.first
    up, down = (first.get_by_role("button", name=n, exact=True) for n in ("Helpful", "Not helpful"))
    await up.click()
    await expect(up).to_have_attribute("aria-pressed", "true")
    await expect(first.get_by_role("status")).to_have_text("Thanks for your feedback!")
    await down.click()
    await expect(down).to_have_attribute("aria-pressed", "true")
    await expect(up).to_have_attribute("aria-pressed", "false")

    # A thumbs down on the last, with a comment.
    last = answers.last
    await last.get_by_role("button", name="Not helpful").click()
    box = last.get_by_role("textbox", name="What was missing? (optional)")
    await expect(box).to_be_focused()
    await box.fill(COMMENT)
    await no_layout_problems(page)
    await page.screenshot(path=tmp_path / "feedback-1280-comment.png")
    await last.locator(".feedback-form").get_by_role("button", name="Send").click()
    await expect(last.get_by_role("status")).to_have_text("Thanks for your feedback!")
    await expect(box).to_be_hidden()

    rows = await pool.fetch(
        """SELECT f.rating, f.comment, t.query FROM feedback f JOIN turns t ON t.id = f.turn_id
            ORDER BY f.turn_id"""
    )
    assert [(r["rating"], r["comment"], r["query"]) for r in rows] == [
        ("down", None, QUESTIONS[0]),
        ("down", COMMENT, QUESTIONS[2]),
    ]
    assert (
        await pool.fetchval(
            "SELECT count(*) FROM content_gaps WHERE reason = 'thumbs_down' AND resolved_at IS NULL"
        )
        == 2
    )

    await no_layout_problems(page)
    await page.screenshot(path=tmp_path / "feedback-1280.png")
    await page.set_viewport_size({"width": 360, "height": 640})
    await chat.get_by_role("log").evaluate("el => { el.scrollTop = el.scrollHeight; }")
    await no_layout_problems(page)
    await page.screenshot(path=tmp_path / "feedback-360.png")
    await first.scroll_into_view_if_needed()
    await page.screenshot(path=tmp_path / "feedback-360-first.png")

    # After a reload the choices are still shown.
    await page.reload()
    await open_chat(page, "Open chat")
    restored = widget(page).locator(".msg.bot:not(.greeting)")
    await expect(restored.first.get_by_role("button", name="Not helpful")).to_have_attribute(
        "aria-pressed", "true"
    )
    await expect(
        restored.nth(1).get_by_role("button", name="Helpful", exact=True)
    ).to_have_attribute("aria-pressed", "false")
    await page.close()
