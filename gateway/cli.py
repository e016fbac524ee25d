"""The `parley` command: serve the gateway, migrate the database, manage agents."""

from __future__ import annotations

import argparse
import asyncio
import errno
import json
import logging
import socket
import sys
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

from aiohttp import web

from core.errors import ConfigError, ParleyError
from core.logcontext import configure_logging
from core.retrieval.embedders import configured_embedder
from core.settings import Settings, load_settings
from core.store import Agents, Database, open_database
from gateway.access_log import AccessLogger
from gateway.app import create_app
from gateway.worker import run_worker

T = TypeVar("T")

log = logging.getLogger("gateway.cli")

# Seconds in-flight requests get to finish after SIGTERM.
SHUTDOWN_GRACE = 15.0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="parley",
        description="Customer-support bot gateway: website widget, WhatsApp and Telegram, "
        "answered from your own content.",
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    commands.add_parser("serve", help="run the gateway (HTTP, workers and scheduler)")
    commands.add_parser("worker", help="run the background services without HTTP")
    commands.add_parser("migrate", help="apply database migrations and exit")

    agent = commands.add_parser("agent", help="create and list agents")
    agent_commands = agent.add_subparsers(dest="agent_command", metavar="ACTION", required=True)
    create = agent_commands.add_parser("create", help="create an agent")
    create.add_argument("name", metavar="NAME", help="short name used in URLs, e.g. 'shop'")
    create.add_argument("--display-name", help="name shown to staff (default: NAME)")
    create.add_argument("--language", default="en", help="default reply language (default: en)")
    create.add_argument("--timezone", default="UTC", help="IANA time zone (default: UTC)")
    listing = agent_commands.add_parser("list", help="list agents")
    listing.add_argument("--json", action="store_true", help="one JSON object per line")
    show = agent_commands.add_parser("show", help="show one agent")
    show.add_argument("name", metavar="NAME")
    return parser


async def _with_database(
    settings: Settings, work: Callable[[Database], Awaitable[T]], *, small: bool = True
) -> T:
    database = await open_database(settings, max_size=2 if small else 10)
    try:
        return await work(database)
    finally:
        await database.close()


def _listen(host: str, port: int) -> socket.socket:
    """Bind the listening socket before anything starts, so a busy port fails fast."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
    except socket.gaierror:
        raise ConfigError(f"cannot resolve PARLEY_HOST {host!r}") from None
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(address)
        sock.listen(512)
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            raise ConfigError(
                f"port {port} on {host} is already in use; "
                "stop the other process or set PARLEY_PORT"
            ) from None
        raise ConfigError(f"cannot listen on {host}:{port}: {exc.strerror}") from None
    return sock


def _serve(settings: Settings) -> None:
    sock = _listen(settings.host, settings.port)
    web.run_app(
        create_app(settings),
        sock=sock,
        print=None,
        shutdown_timeout=SHUTDOWN_GRACE,
        access_log_class=AccessLogger,
    )
    log.info("gateway.stopped")


async def _migrate(database: Database) -> None:
    # open_database has applied the migrations; report where things stand.
    version = await database.pool.fetchval("SELECT max(version) FROM schema_migrations")
    print(f"database is at migration {version:04d} ({database.description})")


def _print_agent(agent_line: dict[str, object]) -> None:
    width = max(len(k) for k in agent_line)
    for key, value in agent_line.items():
        print(f"{key.ljust(width)}  {value}")


def _run(args: argparse.Namespace, settings: Settings) -> None:
    if args.command == "serve":
        _serve(settings)
    elif args.command == "worker":
        asyncio.run(run_worker(settings))
    elif args.command == "migrate":
        asyncio.run(_with_database(settings, _migrate))
    elif args.command == "agent":
        asyncio.run(_with_database(settings, lambda db: _agent(args, settings, db)))


async def _agent(args: argparse.Namespace, settings: Settings, database: Database) -> None:
    agents = Agents(database.pool)
    if args.agent_command == "create":
        agent = await agents.create(
            args.name,
            embedder=configured_embedder(settings),
            name=args.display_name,
            language=args.language,
            timezone=args.timezone,
        )
        print(f"created agent {agent.slug}")
        _print_agent({"language": agent.default_language, "timezone": agent.timezone})
        print(f"widget key  {agent.widget_key}")
    elif args.agent_command == "list":
        for agent in await agents.list():
            if args.json:
                print(
                    json.dumps(
                        {
                            "name": agent.slug,
                            "display_name": agent.name,
                            "language": agent.default_language,
                            "timezone": agent.timezone,
                            "widget_key": agent.widget_key,
                            "knowledge_version": agent.knowledge_version,
                        }
                    )
                )
            else:
                print(f"{agent.slug}\t{agent.default_language}\t{agent.timezone}\t{agent.name}")
    elif args.agent_command == "show":
        agent = await agents.get(args.name)
        _print_agent(
            {
                "name": agent.slug,
                "display name": agent.name,
                "language": agent.default_language,
                "timezone": agent.timezone,
                "widget key": agent.widget_key,
                "allowed origins": ", ".join(agent.allowed_origins) or "(none)",
                "embedder": f"{agent.embedder} ({agent.embedding_dim} dimensions)",
                "knowledge version": agent.knowledge_version,
            }
        )


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        settings = load_settings()
        # One-shot commands print their result; their progress logs only when asked for.
        long_running = args.command in ("serve", "worker")
        quiet = not long_running and "log_level" not in settings.model_fields_set
        configure_logging("WARNING" if quiet else settings.log_level)
        _run(args, settings)
    except ParleyError as exc:
        print(f"parley: error: {exc.message}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
