"""`parley doctor`: one line per part a deployment relies on, each ok, warning or FAILED and
why; exit status 1 when anything failed. Secrets are never printed: hosts, not URLs with
passwords; accounts and bots by name, never their tokens."""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, Protocol, runtime_checkable
from urllib.parse import urlsplit

import aiohttp
import asyncpg
from pydantic import SecretStr

from channels.credentials import own_credentials
from channels.registry import CHANNELS
from core.answer.explore.session import explores
from core.cache import RedisCache
from core.delivery import DeliveryError
from core.errors import ParleyError, ToolsUnsupported, Unavailable
from core.llm.openai_chat import close_chat_model, open_chat_model
from core.llm.openai_client import Endpoint
from core.llm.probe import Finding, ModelServer, ServerProblem, find_model, open_model_server
from core.ports import ChatMessage, ChatModel, Tool
from core.retrieval.embedders import DEFAULT_OPENAI_MODEL
from core.settings import Settings
from core.store import Agent, Agents, open_database
from core.store.database import connect, describe_url
from core.store.embedded import EmbeddedPostgres
from core.store.migrate import bundled_migrations, require_pgvector

Verdict = Literal["ok", "warning", "FAILED"]

# How long Redis may take to answer a PING.
REDIS_TIMEOUT = 5.0
# How long the embedding model may take for one short text.
EMBED_TIMEOUT = 30.0


@dataclass(frozen=True, slots=True)
class Line:
    verdict: Verdict
    subject: str
    detail: str

    def __str__(self) -> str:
        return f"{self.verdict:<8} {self.subject}: {self.detail}"


@runtime_checkable
class CredentialsCheck(Protocol):
    """A channel that can say whom its credentials belong to (the provider is asked)."""

    async def check_credentials(self, agent: Agent | None, settings: Settings) -> str: ...


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    commands.add_parser(
        "doctor",
        help="check the database, Redis, the model server and its models, and the channels' "
        "credentials; exit status 1 when something failed",
    )


def run(args: argparse.Namespace, settings: Settings) -> int:
    return asyncio.run(_doctor(settings))


async def _doctor(settings: Settings) -> int:
    failed = False

    def show(lines: Sequence[Line]) -> None:
        nonlocal failed
        for line in lines:
            failed = failed or line.verdict == "FAILED"
            print(line, flush=True)

    database, agents = await _database(settings)
    show([database])
    show([await _redis(settings)])
    show(await _models(settings, agents))
    show(await _channels(settings, agents))
    return 1 if failed else 0


# -- the database ----------------------------------------------------------------------------


async def _database(settings: Settings) -> tuple[Line, list[Agent] | None]:
    """The database's line, and its agents when they can be read."""
    embedded = None
    try:
        if settings.database_url is not None:
            url = settings.database_url.get_secret_value()
        else:
            embedded = EmbeddedPostgres(settings.data_dir)
            url = await embedded.start()
        where = "embedded PostgreSQL" if embedded is not None else describe_url(url)
        conn = await connect(url)
        try:
            line = await _migrations(conn, where)
        finally:
            await conn.close()
        agents = await _agents(settings, url) if line.verdict == "ok" else None
        return line, agents
    except ParleyError as exc:
        return Line("FAILED", "database", exc.message), None
    finally:
        if embedded is not None:
            await embedded.stop()


async def _migrations(conn: asyncpg.Connection, where: str) -> Line:
    """Whether the database has every migration this Parley ships, and only those."""
    try:
        await require_pgvector(conn)
    except ParleyError as exc:
        return Line("FAILED", "database", f"{where}: {exc.message}")
    try:
        rows = await conn.fetch("SELECT version, checksum FROM schema_migrations")
    except asyncpg.UndefinedTableError:
        rows = []
    applied = {row["version"]: row["checksum"] for row in rows}
    shipped = bundled_migrations()
    latest = shipped[-1].version
    for migration in shipped:
        if applied.get(migration.version, migration.checksum) != migration.checksum:
            return Line(
                "FAILED",
                "database",
                f"{where}: migration {migration.version:04d}_{migration.name} was changed after "
                "it was applied; the start would stop",
            )
    newer = sorted(set(applied) - {m.version for m in shipped})
    if newer:
        return Line(
            "FAILED",
            "database",
            f"{where}: at migration {newer[-1]:04d}, newer than this Parley's {latest:04d}: "
            "run the Parley that migrated it",
        )
    pending = [m.version for m in shipped if m.version not in applied]
    if pending:
        return Line(
            "warning",
            "database",
            f"{where}: reachable; {len(pending)} migration(s) pending ({pending[0]:04d} to "
            f"{pending[-1]:04d}), applied by `parley migrate` or the next start",
        )
    return Line("ok", "database", f"{where}: reachable, migrations current ({latest:04d})")


async def _agents(settings: Settings, url: str) -> list[Agent] | None:
    """Every agent, for their own channel credentials (None when they cannot be read)."""
    at_url = settings.model_copy(update={"database_url": SecretStr(url)})
    try:
        database = await open_database(at_url, apply_migrations=False, max_size=1)
    except ParleyError:
        return None
    try:
        return await Agents(database.pool).list()
    finally:
        await database.close()


# -- Redis -----------------------------------------------------------------------------------


def _redis_where(url: str) -> str:
    parts = urlsplit(url)
    if parts.scheme == "unix":
        return f"unix:{parts.path}"
    port = f":{parts.port}" if parts.port else ""
    return f"{parts.hostname or 'localhost'}{port}{parts.path or '/0'}"


async def _redis(settings: Settings) -> Line:
    if settings.redis_url is None:
        return Line("ok", "redis", "not configured: an in-process cache (one process only)")
    url = settings.redis_url.get_secret_value()
    where = _redis_where(url)
    cache = RedisCache.from_url(url, settings.redis_prefix)
    try:
        async with asyncio.timeout(REDIS_TIMEOUT):
            await cache.ping()
    except Unavailable as exc:
        return Line("FAILED", "redis", f"{where} does not answer: {exc.message}")
    except TimeoutError:
        return Line("FAILED", "redis", f"{where} does not answer within {REDIS_TIMEOUT:g} s")
    finally:
        await cache.close()
    return Line("ok", "redis", f"{where} answers")


# -- the models ------------------------------------------------------------------------------


async def _models(settings: Settings, agents: list[Agent] | None) -> list[Line]:
    lines = []
    server = open_model_server(settings)
    if server is None:
        lines.append(Line("ok", "model", "none configured: answers quote the sources (extractive)"))
        if settings.transcribe_model:
            lines.append(
                Line(
                    "FAILED",
                    f"transcription model {settings.transcribe_model}",
                    "PARLEY_TRANSCRIBE_MODEL is set but no model server is "
                    "(PARLEY_LLM_BASE_URL or PARLEY_LLM_API_KEY)",
                )
            )
    else:
        try:
            lines += await _model_server(settings, server, agents)
        finally:
            await server.close()
    if settings.embed_provider == "openai":
        lines.append(await _embedding(settings))
    return lines


async def _model_server(
    settings: Settings, server: ModelServer, agents: list[Agent] | None
) -> list[Line]:
    try:
        names = await server.models()
    except ServerProblem as problem:
        return [Line("FAILED", f"model server {server.host}", problem.message)]
    listing = "lists no models" if names is None else f"lists {len(names)} model(s)"
    lines = [Line("ok", f"model server {server.host}", f"answers; {listing}")]
    model = settings.llm_model
    found = await find_model(server, model, names)
    lines.append(_model_line("answer", model, found, "PARLEY_LLM_MODEL"))
    others = {
        "rewrite": (settings.rewrite_model, "PARLEY_REWRITE_MODEL"),
        "summary": (settings.summary_model, "PARLEY_SUMMARY_MODEL"),
        "translation": (settings.translate_model, "PARLEY_TRANSLATE_MODEL"),
        "critic": (settings.critic_model, "PARLEY_CRITIC_MODEL"),
    }
    for role, (name, variable) in others.items():
        if name and name != model:
            other = await find_model(server, name, names)
            lines.append(_model_line(role, name, other, variable))
    if found.ok:
        chat = open_chat_model(settings)
        assert chat is not None
        try:
            lines.append(await _streaming(chat))
            lines.append(await _tools(chat, agents))
        finally:
            await close_chat_model(chat)
    if settings.transcribe_model:
        lines.append(_transcription(settings.transcribe_model, server.host, names))
    return lines


def _model_line(role: str, model: str, found: Finding, variable: str) -> Line:
    if found.ok:
        return Line("ok", f"{role} model {model}", found.detail)
    return Line("FAILED", f"{role} model {model}", f"{found.detail} (set by {variable})")


async def _streaming(chat: ChatModel) -> Line:
    """A short answer streamed the way turns stream theirs, within their timeouts."""
    messages = [
        ChatMessage("system", "Answer in one word."),
        ChatMessage("user", "Say OK."),
    ]
    started = time.monotonic()
    pieces = 0
    try:
        # Read to its end (16 tokens at most), so the response closes by itself.
        async for chunk in chat.stream(messages, max_tokens=16, temperature=0):
            pieces += bool(chunk.text)
    except Unavailable as exc:
        return Line("FAILED", "streaming", exc.message)
    seconds = time.monotonic() - started
    if not pieces:
        return Line("warning", "streaming", "the stream ended without any text")
    return Line("ok", "streaming", f"{pieces} piece(s) of text in {seconds:.1f} s")


async def _tools(chat: ChatModel, agents: list[Agent] | None) -> Line:
    """Whether the model calls the one trivial tool offered, asked as exploration asks (the
    first request with tools makes the model call one): exploration mode needs it."""
    exploring = [a.slug for a in agents or () if explores(a.settings)]
    messages = [
        ChatMessage("system", "Call the tool get_time."),
        ChatMessage("user", "What time is it?"),
    ]
    tool = Tool("get_time", "The current time.", {"type": "object", "properties": {}})
    try:
        reply = await chat.respond(messages, tools=[tool], max_tokens=64, temperature=0)
    except ToolsUnsupported as exc:
        problem = exc.message
    except Unavailable as exc:
        return Line("FAILED", "tool calls", exc.message)
    else:
        if reply.tool_calls:
            return Line("ok", "tool calls", f"the model called {reply.tool_calls[0].name}")
        problem = "the model answered in text"
    if exploring:
        needed = f"exploration mode of {', '.join(exploring)} answers from the search instead"
        return Line("FAILED", "tool calls", f"{problem}; {needed}")
    return Line(
        "warning", "tool calls", f"{problem}; exploration mode would answer from the search"
    )


def _transcription(model: str, host: str, names: list[str] | None) -> Line:
    subject = f"transcription model {model}"
    if names is None:
        return Line("warning", subject, f"not verified: {host} lists no models")
    if model in names:
        return Line("ok", subject, f"listed by {host}")
    return Line("FAILED", subject, f"not among the models {host} lists")


async def _embedding(settings: Settings) -> Line:
    model = settings.embed_model or DEFAULT_OPENAI_MODEL
    key = settings.llm_api_key.get_secret_value() if settings.llm_api_key else "unused"
    server = ModelServer(Endpoint(key, settings.embed_base_url), timeout=EMBED_TIMEOUT)
    subject = f"embedding model {model}"
    try:
        dimension = await server.embed(model)
    except ServerProblem as problem:
        return Line("FAILED", subject, problem.message)
    finally:
        await server.close()
    return Line("ok", subject, f"{server.host} answers with {dimension}-dimensional vectors")


# -- the channels ----------------------------------------------------------------------------


def _in_environment(fields: Sequence[str | None], settings: Settings) -> bool:
    """Whether any of a channel's settings is set in the environment."""
    for name in fields:
        value = getattr(settings, name) if name else None
        if isinstance(value, SecretStr):
            value = value.get_secret_value()
        if value:
            return True
    return False


async def _channels(settings: Settings, agents: list[Agent] | None) -> list[Line]:
    lines = []
    for channel in CHANNELS:
        whose: list[Agent | None] = []
        if _in_environment([f.setting for f in channel.credential_fields], settings):
            whose.append(None)
        whose += [a for a in agents or () if own_credentials(a.settings.get(channel.block))]
        for agent in whose:
            subject = (
                f"{channel.title} ({'environment' if agent is None else 'agent ' + agent.slug})"
            )
            if not isinstance(channel, CredentialsCheck):
                lines.append(
                    Line("warning", subject, "this channel's credentials cannot be checked")
                )
                continue
            lines.append(await _credentials(channel, subject, agent, settings))
    if agents is None:
        lines.append(
            Line("warning", "channels", "agents' own credentials not checked: no database")
        )
    elif not lines:
        lines.append(Line("ok", "channels", "none configured (the widget and the API answer)"))
    return lines


async def _credentials(
    channel: CredentialsCheck, subject: str, agent: Agent | None, settings: Settings
) -> Line:
    try:
        found = await channel.check_credentials(agent, settings)
    except (ParleyError, DeliveryError) as exc:
        return Line("FAILED", subject, exc.message)
    except (aiohttp.ClientError, OSError, TimeoutError) as exc:
        return Line("FAILED", subject, f"no answer ({type(exc).__name__})")
    return Line("ok", subject, found)
