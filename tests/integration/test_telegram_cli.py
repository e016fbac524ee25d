"""`parley telegram set-webhook` and `poll` as a user runs them, against a local Bot API."""

from __future__ import annotations

import asyncio
import json
import re
import signal
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from pytest_aiohttp import AiohttpServer

from core.keyring import Keyring
from core.retrieval.embedders import UseEmbedder
from core.store import Agent, Agents, Database
from core.store.inbox import Inbox, InboxRow
from core.store.vector_index import EmbedderIdentity
from tests.conftest import SECRETS_KEY
from tests.fakes.telegram import FakeTelegram
from tests.integration.test_telegram_webhook import GROUP, start_command, text, update
from tests.support.cli import PARLEY, clean_env

SECRET = "env-Secret_token-0123456789-abcdefghijkl"
AGENT_SECRET = "agent-secret-9876543210-ZYXWVUTSRQPONMLK"
PUBLIC_URL = "https://support.example.com"
WRONG_TOKEN = "111111111:AAWrongTokenWrongTokenWrongToken_00"


@dataclass
class Setup:
    fake: FakeTelegram
    agent: Agent
    agents: Agents
    inbox: Inbox
    env: dict[str, str]
    cwd: Path

    async def rows(self) -> list[InboxRow]:
        return await self.inbox.rows(self.agent.id, "telegram")

    async def wait_for_rows(self, count: int) -> list[InboxRow]:
        async with asyncio.timeout(30):
            while len(rows := await self.rows()) < count:
                await asyncio.sleep(0.05)
        return rows


@pytest.fixture
async def setup(
    aiohttp_server: AiohttpServer,
    database: Database,
    database_url: str,
    use_embedder: UseEmbedder,
    tmp_path: Path,
) -> Setup:
    fake = FakeTelegram()
    server = await aiohttp_server(fake.app())
    agents = Agents(database.pool, keyring=Keyring(SECRETS_KEY))
    agent = await agents.create("shop", embedder=EmbedderIdentity.of(use_embedder))
    env = {
        "PARLEY_DATABASE_URL": database_url,
        "PARLEY_SECRETS_KEY": SECRETS_KEY,
        "PARLEY_TELEGRAM_API_BASE": str(server.make_url("")).rstrip("/"),
        "PARLEY_PUBLIC_URL": PUBLIC_URL,
        "TELEGRAM_BOT_TOKEN": fake.token,
        "TELEGRAM_WEBHOOK_SECRET": SECRET,
    }
    return Setup(fake, agent, agents, Inbox(database.pool), env, tmp_path)


def _env(setup: Setup, overrides: dict[str, str]) -> dict[str, str]:
    """The setup's environment with ``overrides``; an empty value unsets the variable."""
    return clean_env(**{k: v for k, v in (setup.env | overrides).items() if v})


async def _parley(setup: Setup, *args: str, **env: str) -> tuple[int, str, str]:
    """Run the CLI without blocking this event loop (the fake Bot API runs on it)."""
    process = await asyncio.create_subprocess_exec(
        PARLEY,
        "telegram",
        *args,
        cwd=setup.cwd,
        env=_env(setup, env),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(process.communicate(), timeout=120)
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


def _params(fake: FakeTelegram, method: str) -> list[dict[str, Any]]:
    return [call["params"] for call in fake.calls if call["method"] == method]


async def test_set_webhook_registers_the_public_url_and_secret(setup: Setup) -> None:
    code, out, err = await _parley(setup, "set-webhook", "--agent", "shop")
    assert code == 0, err
    [sent] = _params(setup.fake, "setWebhook")
    assert sent["url"] == f"{PUBLIC_URL}/webhooks/telegram/shop"
    assert sent["secret_token"] == SECRET
    assert json.loads(sent["allowed_updates"]) == ["message", "callback_query"]
    assert (sent["max_connections"], sent["drop_pending_updates"]) == ("40", "false")
    assert setup.fake.webhook is not None
    assert setup.fake.webhook["url"] == f"{PUBLIC_URL}/webhooks/telegram/shop"
    assert out.splitlines() == [
        f"webhook of @parley_test_bot for shop: {PUBLIC_URL}/webhooks/telegram/shop",
        "0 pending updates",
    ]
    assert [c["method"] for c in setup.fake.calls] == ["getMe", "setWebhook", "getWebhookInfo"]
    assert setup.fake.token not in out + err
    assert SECRET not in out + err


async def test_the_agents_own_bot_and_an_explicit_url_win(setup: Setup) -> None:
    await setup.agents.update(
        "shop",
        settings={"telegram": {"bot_token": setup.fake.token, "webhook_secret": AGENT_SECRET}},
    )
    tunnel = "https://shop-dev.tunnel.example.net:8443/webhooks/telegram/shop"
    code, out, err = await _parley(
        setup, "set-webhook", "--agent", "shop", "--url", tunnel, TELEGRAM_BOT_TOKEN=WRONG_TOKEN
    )
    assert code == 0, err
    [sent] = _params(setup.fake, "setWebhook")
    assert (sent["url"], sent["secret_token"]) == (tunnel, AGENT_SECRET)
    assert tunnel in out


async def test_set_webhook_errors_are_one_line_and_call_nothing(setup: Setup) -> None:
    cases = [
        ({"PARLEY_PUBLIC_URL": ""}, [], "PARLEY_PUBLIC_URL is not set"),
        ({"PARLEY_PUBLIC_URL": "http://localhost:8080"}, [], "Telegram only calls https"),
        ({}, ["--url", "http://127.0.0.1:8080/webhooks/telegram/shop"], "only calls https"),
        ({}, ["--url", "https://example.com:9000/hook"], "ports 443, 80, 88 and 8443"),
        ({"TELEGRAM_BOT_TOKEN": ""}, [], "set TELEGRAM_BOT_TOKEN"),
        ({"TELEGRAM_WEBHOOK_SECRET": ""}, [], "set TELEGRAM_WEBHOOK_SECRET"),
        ({"TELEGRAM_WEBHOOK_SECRET": "too-short_0123456789"}, [], "at least 32 characters"),
    ]
    for env, extra, expected in cases:
        code, out, err = await _parley(setup, "set-webhook", "--agent", "shop", *extra, **env)
        assert code == 2, (env, extra, err)
        [line] = err.splitlines()
        assert line.startswith("parley: error: ")
        assert expected in line
        assert out == ""
    assert setup.fake.calls == []


async def test_set_webhook_makes_and_stores_a_strong_secret_when_the_agent_has_none(
    setup: Setup,
) -> None:
    """An agent's own bot without a webhook secret, or with one weaker than Telegram's allow
    now (stored by an earlier version), gets a new one: random, 43 characters of Telegram's
    alphabet, stored encrypted, registered, never printed. A strong one is kept."""
    for stored in (None, "weak-secret_1"):
        setup.fake.calls.clear()
        block = {"bot_token": setup.fake.token} | ({"webhook_secret": stored} if stored else {})
        await setup.agents.update("shop", settings={"telegram": block, "persona_note": "kept"})
        code, out, err = await _parley(setup, "set-webhook", "--agent", "shop")
        assert code == 0, err
        [sent] = _params(setup.fake, "setWebhook")
        made = sent["secret_token"]
        assert re.fullmatch(r"[A-Za-z0-9_-]{43}", made), made
        assert made != stored
        assert made not in out + err
        assert "stored a new webhook secret for shop" in out
        settings = (await setup.agents.get("shop")).settings
        assert settings["persona_note"] == "kept"
        bot = settings["telegram"]["bot_token"]  # sealed now, if it was stored in clear
        if not isinstance(bot, str):
            bot = Keyring(SECRETS_KEY).open(bot, what="the test").get_secret_value()
        assert bot == setup.fake.token
        sealed = settings["telegram"]["webhook_secret"]
        assert made not in json.dumps(sealed)
        assert Keyring(SECRETS_KEY).open(sealed, what="the test").get_secret_value() == made

        setup.fake.calls.clear()
        code, out, err = await _parley(setup, "set-webhook", "--agent", "shop")
        assert code == 0, err
        assert [p["secret_token"] for p in _params(setup.fake, "setWebhook")] == [made]
        assert "stored a new webhook secret" not in out


async def test_a_token_telegram_refuses_is_one_line_without_the_token(setup: Setup) -> None:
    code, _, err = await _parley(
        setup, "set-webhook", "--agent", "shop", TELEGRAM_BOT_TOKEN=WRONG_TOKEN
    )
    assert code == 2
    [line] = err.splitlines()
    assert line.startswith("parley: error: Telegram refused the bot token")
    assert WRONG_TOKEN not in err


async def _start_poll(setup: Setup, **env: str) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        PARLEY,
        "telegram",
        "poll",
        "--agent",
        "shop",
        cwd=setup.cwd,
        env=_env(setup, env),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )


async def _stop(process: asyncio.subprocess.Process) -> tuple[int, str]:
    if process.returncode is None:
        process.send_signal(signal.SIGTERM)
    _, err = await asyncio.wait_for(process.communicate(), timeout=30)
    assert process.returncode is not None
    return process.returncode, err.decode()


async def _polling(setup: Setup, process: asyncio.subprocess.Process, calls: int) -> None:
    """Wait until the poller has made ``calls`` getUpdates calls, failing if it exits."""
    waiting = asyncio.create_task(setup.fake.wait_for("getUpdates", calls))
    exited = asyncio.create_task(process.wait())
    done, _ = await asyncio.wait([waiting, exited], timeout=90, return_when=asyncio.FIRST_COMPLETED)
    waiting.cancel()
    exited.cancel()
    if waiting not in done:
        _, err = await process.communicate() if exited in done else (b"", b"")
        raise AssertionError(f"poll made no getUpdates call: {err.decode()}")


async def test_poll_stores_updates_like_the_webhook_and_stops_on_sigterm(setup: Setup) -> None:
    setup.fake.webhook = {"url": f"{PUBLIC_URL}/webhooks/telegram/shop"}
    process = await _start_poll(setup)
    try:
        await _polling(setup, process, 1)
        assert setup.fake.webhook is None  # Telegram refuses getUpdates while one is set
        joined = {"id": 777, "is_bot": False, "first_name": "Bob"}
        edited = update(800003, "edited_message", text="Where is my order??", edit_date=1)
        service = update(800002, chat=GROUP, new_chat_members=[joined], new_chat_member=joined)
        sent = [
            text(800001, "Waar blijft mijn bestelling?"),
            service,
            edited,
            start_command(800004),
        ]
        await setup.fake.push(*sent)
        rows = await setup.wait_for_rows(2)
        await _polling(setup, process, 2)  # the next call confirms what was stored
    finally:
        code, err = await _stop(process)
    assert code == 0, err
    assert [r.provider_message_id for r in rows] == ["800001", "800004"]
    assert [dict(r.payload) for r in rows] == [sent[0], sent[3]]
    assert [(r.inbound.text, r.inbound.command) for r in rows] == [
        ("Waar blijft mijn bestelling?", None),
        (sent[3]["message"]["text"], "start"),
    ]
    assert rows[0].conversation_key == "555000111"
    assert "telegram.poll.stored agent=shop update_id=800001 kind=text" in err
    assert "telegram.poll.ignored agent=shop update_id=800002 kind=service" in err
    assert "telegram.poll.ignored agent=shop update_id=800003 kind=edited_message" in err
    assert "telegram.poll.stopped agent=shop" in err
    assert "deleted the webhook" in err
    assert setup.fake.token not in err
    assert "Waar blijft" not in err
    polls = _params(setup.fake, "getUpdates")
    assert {p["timeout"] for p in polls if p.get("limit") == "100"} == {"25"}
    assert json.loads(polls[0]["allowed_updates"]) == ["message", "callback_query"]
    assert "offset" not in polls[0]
    assert polls[1]["offset"] == "800005"
    assert setup.fake.pending == []  # every update was confirmed


async def test_a_restarted_poll_does_not_store_an_update_twice(setup: Setup) -> None:
    first = await _start_poll(setup)
    try:
        await _polling(setup, first, 1)
        await setup.fake.push(text(800101))
        await setup.wait_for_rows(1)
    finally:
        code, err = await _stop(first)
    assert code == 0, err

    # As after a crash before Telegram heard the offset: the update comes again.
    await setup.fake.push(text(800101), text(800102, "And my invoice?"))
    second = await _start_poll(setup)
    try:
        await _polling(setup, second, 1)
        rows = await setup.wait_for_rows(2)
        await _polling(setup, second, 2)
    finally:
        code, err = await _stop(second)
    assert code == 0, err
    assert [r.provider_message_id for r in rows] == ["800101", "800102"]
    assert len(await setup.rows()) == 2
    assert "telegram.poll.duplicate agent=shop update_id=800101" in err
    assert "telegram.poll.stored agent=shop update_id=800102" in err


async def test_poll_needs_no_webhook_secret_but_a_token(setup: Setup) -> None:
    code, _, err = await _parley(setup, "poll", "--agent", "shop", TELEGRAM_BOT_TOKEN="")
    assert code == 2
    [line] = err.splitlines()
    assert "set TELEGRAM_BOT_TOKEN" in line

    process = await _start_poll(setup, TELEGRAM_WEBHOOK_SECRET="")
    try:
        await _polling(setup, process, 1)
    finally:
        code, err = await _stop(process)
    assert code == 0, err
