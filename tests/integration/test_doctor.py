"""`parley doctor` against the local fakes, and the model's place in /readyz and at start."""

from __future__ import annotations

import asyncio
import logging
import subprocess
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from core.keyring import Keyring
from core.retrieval.embedders import UseEmbedder
from core.store import Agents, Database
from core.store.migrate import bundled_migrations
from core.store.vector_index import EmbedderIdentity
from gateway.app import create_app
from tests.conftest import SECRETS_KEY, MakeSettings
from tests.fakes.meta import FakeMeta
from tests.fakes.openai import FakeOpenAI
from tests.fakes.telegram import FakeTelegram
from tests.fakes.twilio import FakeTwilio
from tests.support.cli import run_parley
from tests.support.services import free_port

Client = TestClient[web.Request, web.Application]
MakeClient = Callable[[web.Application], Awaitable[Client]]

MODEL = "qwen2.5:7b-instruct"
KEY = "sk-doctor-0123456789abcdef"
LATEST = bundled_migrations()[-1].version


@dataclass
class Fakes:
    llm: FakeOpenAI
    twilio: FakeTwilio
    telegram: FakeTelegram
    meta: FakeMeta
    env: dict[str, str]


@pytest.fixture
async def fakes(database_url: str, redis_url: str) -> AsyncIterator[Fakes]:
    llm = FakeOpenAI(
        model_list=[MODEL, "whisper-1", "nomic-embed-text:latest"], missing_models="ollama"
    )
    twilio, telegram, meta = FakeTwilio(), FakeTelegram(), FakeMeta()
    servers = [TestServer(fake.app()) for fake in (llm, twilio, telegram, meta)]
    for server in servers:
        await server.start_server()
    llm_url, twilio_url, telegram_url, meta_url = (
        str(server.make_url("")).rstrip("/") for server in servers
    )
    env = {
        "PARLEY_DATABASE_URL": database_url,
        "PARLEY_REDIS_URL": redis_url,
        "PARLEY_SECRETS_KEY": SECRETS_KEY,
        "PARLEY_LLM_BASE_URL": f"{llm_url}/v1",
        "PARLEY_LLM_API_KEY": KEY,
        "PARLEY_LLM_MODEL": MODEL,
        "PARLEY_TRANSCRIBE_MODEL": "whisper-1",
        "PARLEY_EMBED_PROVIDER": "openai",
        "PARLEY_EMBED_BASE_URL": f"{llm_url}/v1",
        "PARLEY_EMBED_MODEL": "nomic-embed-text",
        "TWILIO_ACCOUNT_SID": twilio.account_sid,
        "TWILIO_AUTH_TOKEN": twilio.auth_token,
        "TWILIO_WHATSAPP_FROM": "whatsapp:+14155238886",
        "PARLEY_TWILIO_API_BASE": twilio_url,
        "TELEGRAM_BOT_TOKEN": telegram.token,
        "PARLEY_TELEGRAM_API_BASE": telegram_url,
        "META_APP_SECRET": meta.app_secret,
        "META_VERIFY_TOKEN": "meta-verify-token-0123456789",
        "META_ACCESS_TOKEN": meta.access_token,
        "META_PHONE_NUMBER_ID": meta.phone_number_id,
        "PARLEY_META_API_BASE": meta_url,
    }
    yield Fakes(llm, twilio, telegram, meta, env)
    for server in servers:
        await server.close()


async def _doctor(tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    """`parley doctor` in a thread of its own: the fakes answer on this event loop."""
    return await asyncio.to_thread(run_parley, "doctor", cwd=tmp_path, **env)


def _lines(result: subprocess.CompletedProcess[str]) -> dict[str, str]:
    """Each line's subject -> the line."""
    assert "Traceback" not in result.stderr, result.stderr
    return {line[9:].partition(": ")[0]: line for line in result.stdout.splitlines()}


async def test_doctor_with_everything_healthy_says_ok_on_every_line(
    fakes: Fakes, database: Database, use_embedder: UseEmbedder, tmp_path: Path
) -> None:
    # An agent with a Telegram bot of its own (the fake knows one token: the same one).
    agents = Agents(database.pool, keyring=Keyring(SECRETS_KEY))
    await agents.create("shop", embedder=EmbedderIdentity.of(use_embedder))
    await agents.update(
        "shop",
        settings={
            "telegram": {
                "bot_token": fakes.telegram.token,
                "webhook_secret": "agent-secret-9876543210-ZYXWVUTSRQPONMLK",
            }
        },
    )

    result = await _doctor(tmp_path, **fakes.env)

    assert result.returncode == 0, result.stdout + result.stderr
    lines = _lines(result)
    assert all(line.startswith("ok       ") for line in lines.values()), result.stdout
    assert list(lines) == [
        "database",
        "redis",
        "model server 127.0.0.1",
        f"answer model {MODEL}",
        "streaming",
        "tool calls",
        "transcription model whisper-1",
        "embedding model nomic-embed-text",
        "WhatsApp (Twilio) (environment)",
        "Telegram (environment)",
        "Telegram (agent shop)",
        "WhatsApp (Meta) (environment)",
    ]
    assert f"migrations current ({LATEST:04d})" in lines["database"]
    assert "answers; lists 3 model(s)" in lines["model server 127.0.0.1"]
    assert "'Parley test account' (active)" in lines["WhatsApp (Twilio) (environment)"]
    assert "bot @parley_test_bot" in lines["Telegram (agent shop)"]
    assert "Noordkaap Outdoor" in lines["WhatsApp (Meta) (environment)"]
    # It asked what it says it checked: a stream, and a forced call of one tool.
    streamed, tools = fakes.llm.chat_requests
    assert streamed["stream"] is True
    assert tools["tool_choice"] == "required"
    assert [t["function"]["name"] for t in tools["tools"]] == ["get_time"]
    for secret in (
        KEY,
        fakes.twilio.auth_token,
        fakes.telegram.token,
        fakes.meta.access_token,
        fakes.meta.app_secret,
        SECRETS_KEY,
    ):
        assert secret not in result.stdout + result.stderr


@pytest.mark.parametrize(
    ("server", "listing", "said"),
    [
        ("ollama", ["llama3.2:latest"], 'model "gpt-4o-mini" not found, try pulling it first'),
        ("vllm", ["meta-llama/Llama-3.1-8B-Instruct"], "The model `gpt-4o-mini` does not exist."),
        ("vllm", None, "The model `gpt-4o-mini` does not exist."),  # no model list to read
    ],
)
async def test_doctor_names_a_model_the_server_answers_404_for(
    fakes: Fakes,
    tmp_path: Path,
    server: Literal["ollama", "vllm"],
    listing: list[str] | None,
    said: str,
) -> None:
    fakes.llm.missing_models = server
    fakes.llm.model_list = listing
    env = {**fakes.env, "PARLEY_TRANSCRIBE_MODEL": "", "PARLEY_EMBED_PROVIDER": "use"}
    del env["PARLEY_LLM_MODEL"]  # the default, gpt-4o-mini, which such servers do not have

    result = await _doctor(tmp_path, **env)

    assert result.returncode == 1, result.stdout + result.stderr
    line = _lines(result)["answer model gpt-4o-mini"]
    assert line.startswith("FAILED   answer model gpt-4o-mini: not found: 127.0.0.1 answered 404: ")
    assert said in line
    assert line.endswith("(set by PARLEY_LLM_MODEL)")
    if listing is not None:
        assert f"; it lists {listing[0]} (set by" in line
    # What needs the model is not tried with a name the server does not have.
    assert not any(body.get("stream") for body in fakes.llm.chat_requests)


async def test_a_model_without_tools_is_a_warning_and_a_failure_for_an_agent_that_explores(
    fakes: Fakes, database: Database, use_embedder: UseEmbedder, tmp_path: Path
) -> None:
    # llama.cpp with a chat template without tools drops them without a word: text comes back.
    fakes.llm.server = "llama.cpp"
    fakes.llm.tools_supported = False
    result = await _doctor(tmp_path, **fakes.env)
    assert result.returncode == 0, result.stdout + result.stderr
    line = _lines(result)["tool calls"]
    assert line.startswith(f"warning  tool calls: language model '{MODEL}' takes no tools")
    assert line.endswith("exploration mode would answer from the search")

    agents = Agents(database.pool)
    await agents.create("shop", embedder=EmbedderIdentity.of(use_embedder))
    await agents.update("shop", settings={"exploration": True})
    result = await _doctor(tmp_path, **fakes.env)
    assert result.returncode == 1
    assert _lines(result)["tool calls"].endswith(
        "exploration mode of shop answers from the search instead"
    )


async def test_doctor_with_the_database_stopped_fails_saying_so(
    tmp_path: Path, redis_url: str
) -> None:
    port = free_port()  # the database's port, with nothing listening on it
    result = await _doctor(
        tmp_path,
        PARLEY_DATABASE_URL=f"postgresql://parley:s3cret-pw@127.0.0.1:{port}/parley",
        PARLEY_REDIS_URL=redis_url,
    )
    assert result.returncode == 1, result.stdout + result.stderr
    lines = _lines(result)
    assert lines["database"].startswith(
        f"FAILED   database: cannot reach the database at 127.0.0.1:{port}/parley"
    )
    # The rest is still checked, and what needs the database says it was not.
    assert lines["redis"].startswith("ok ")
    assert lines["model"].startswith("ok       model: none configured")
    assert lines["channels"].startswith("warning  channels: agents' own credentials not checked")
    assert "s3cret-pw" not in result.stdout + result.stderr


async def test_doctor_says_when_redis_is_not_configured_and_fails_when_it_is_down(
    tmp_path: Path, database_url: str
) -> None:
    alone = _lines(await _doctor(tmp_path, PARLEY_DATABASE_URL=database_url))
    assert (
        alone["redis"] == "ok       redis: not configured: an in-process cache (one process only)"
    )
    port = free_port()
    down = await _doctor(
        tmp_path,
        PARLEY_DATABASE_URL=database_url,
        PARLEY_REDIS_URL=f"redis://:r3dis-pw@127.0.0.1:{port}/0",
    )
    assert down.returncode == 1
    assert _lines(down)["redis"].startswith(f"FAILED   redis: 127.0.0.1:{port}/0 does not answer")
    assert "r3dis-pw" not in down.stdout


async def test_readyz_shows_the_model_degraded_while_its_server_is_down(
    aiohttp_client: MakeClient, make_settings: MakeSettings, caplog: pytest.LogCaptureFixture
) -> None:
    """Readiness stays 200 (every gateway shares the model; webhooks are still taken in),
    and `parley serve` says at start which model on which host it cannot reach."""
    caplog.set_level(logging.INFO)
    port = free_port()
    settings = make_settings(
        llm_base_url=f"http://127.0.0.1:{port}/v1", llm_api_key=KEY, llm_model=MODEL
    )
    client = await aiohttp_client(create_app(settings))

    response = await client.get("/readyz")
    assert response.status == 200
    body = await response.json()
    assert body["status"] == "degraded"
    assert body["checks"]["database"] == "ok"
    assert body["checks"][f"model ({MODEL})"].startswith("degraded: cannot connect to 127.0.0.1")
    assert f"llm.check.failed model={MODEL} host=127.0.0.1" in caplog.text

    # The server comes up: the next check (a second on) finds the model and all is ready.
    llm = FakeOpenAI(model_list=[MODEL])
    server = TestServer(llm.app(), port=port)
    await server.start_server()
    try:
        await asyncio.sleep(1.1)
        body = await (await client.get("/readyz")).json()
        assert body == {
            "status": "ready",
            "checks": {"database": "ok", "cache (redis)": "ok", f"model ({MODEL})": "ok"},
        }
        assert llm.chat_requests == []  # listed: no tokens spent on checks
    finally:
        await server.close()
