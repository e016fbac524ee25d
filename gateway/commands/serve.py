"""`parley serve [--demo] [--host H] [--port P]`: bind the port first, prepare the demo if
asked, run until SIGTERM."""

from __future__ import annotations

import argparse
import asyncio
import errno
import logging
import secrets
import socket
import sys

from aiohttp import web
from pydantic import SecretStr

from core.errors import ConfigError, NotFound
from core.knowledge.ingest import Ingestor
from core.knowledge.sources import parse_source
from core.settings import Settings
from core.store import Agents
from core.store.knowledge import KnowledgeStore
from core.store.vector_index import EmbedderIdentity
from gateway.access_log import AccessLogger
from gateway.app import create_app, shutdown_grace
from gateway.demo import DEMO_SITE, DemoSite
from gateway.runtime import open_runtime

log = logging.getLogger(__name__)

DEMO_AGENT = "demo"


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    serve = commands.add_parser("serve", help="run the gateway (HTTP, workers and scheduler)")
    serve.add_argument(
        "--demo",
        action="store_true",
        help="serve the bundled sample shop at / with the chat bubble (agent 'demo')",
    )
    serve.add_argument(
        "--host",
        metavar="HOST",
        help="address to listen on (default PARLEY_HOST, 127.0.0.1; 0.0.0.0: every interface)",
    )
    serve.add_argument(
        "--port",
        type=_port,
        metavar="PORT",
        help="port to listen on (default PARLEY_PORT, 8080)",
    )
    serve.add_argument(
        "--no-workers",
        action="store_true",
        help="HTTP only: WhatsApp / Telegram answers and scheduled jobs run in `parley worker`",
    )


def _port(value: str) -> int:
    try:
        port = int(value)
    except ValueError:
        port = 0
    if not 1 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"{value!r} is not a port number (1-65535)")
    return port


def _listen(host: str, port: int) -> socket.socket:
    """Bind the listening socket before anything starts, so a busy port fails fast."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
    except socket.gaierror:
        raise ConfigError(f"cannot resolve the host {host!r} (--host or PARLEY_HOST)") from None
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(address)
        sock.listen(512)
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            raise ConfigError(
                f"port {port} on {host} is already in use; stop the other process "
                "or choose another port with --port (or PARLEY_PORT)"
            ) from None
        raise ConfigError(f"cannot listen on {host}:{port}: {exc.strerror}") from None
    return sock


# Without words of one language: it is quoted inside answers in every language.
DEMO_CONTACT_ROUTE = "service@noordkaap.example, +31 10 341 27 90"


async def prepare_demo(settings: Settings) -> DemoSite:
    """Agent `demo` with the sample shop ingested; only the first start does real work."""
    if not DEMO_SITE.is_dir():
        raise ConfigError(f"the sample shop is missing ({DEMO_SITE}); run from a full checkout")
    async with open_runtime(settings) as runtime:
        agents = Agents(runtime.database.pool)
        try:
            agent = await agents.get(DEMO_AGENT)
        except NotFound:
            agent = await agents.create(
                DEMO_AGENT,
                embedder=EmbedderIdentity.of(runtime.embedder),
                name="Noordkaap Outdoor",  # listed as "Noordkaap Outdoor (demo)": the slug follows
                language="en",
                timezone="Europe/Amsterdam",
            )
            # the sample shop's own contact page, so a deferral tells visitors where to go
            agent = await agents.update(DEMO_AGENT, contact_route=DEMO_CONTACT_ROUTE)
            log.info("demo.agent.created widget_key=%s", agent.widget_key)
        ingestor = Ingestor(KnowledgeStore(runtime.database.pool), runtime.embedder)
        report = await ingestor.ingest(agent, parse_source(str(DEMO_SITE)))
        log.info(
            "demo.ready pages_added=%d unchanged=%d chunks_embedded=%d",
            report.added,
            report.unchanged,
            report.chunks_embedded,
        )
        return DemoSite(DEMO_SITE, agent.slug, agent.widget_key)


def _demo_console(settings: Settings) -> Settings:
    """The demo's staff console opens with a token made for this run, unless one is set.

    It goes to the terminal that started the demo (as a notebook server's does), never to the
    log: it is the key to every conversation.
    """
    if settings.admin_token is not None:
        print(f"Staff console: http://{settings.host}:{settings.port}/admin", file=sys.stderr)
        return settings
    token = secrets.token_urlsafe(24)
    print(
        f"Staff console: http://{settings.host}:{settings.port}/admin "
        f"(sign in with the token {token}; it lasts while this demo runs)",
        file=sys.stderr,
    )
    return settings.model_copy(update={"admin_token": SecretStr(token)})


def serve(args: argparse.Namespace, settings: Settings) -> None:
    # The flags win over the environment for this run only; both are checked already.
    given = {"host": args.host, "port": args.port}
    settings = settings.model_copy(update={k: v for k, v in given.items() if v is not None})
    sock = _listen(settings.host, settings.port)
    demo = asyncio.run(prepare_demo(settings)) if args.demo else None
    if demo is not None:
        log.info("demo.open url=http://%s:%d/", settings.host, settings.port)
        settings = _demo_console(settings)
    web.run_app(
        create_app(settings, demo, background=not args.no_workers),
        sock=sock,
        print=None,
        shutdown_timeout=shutdown_grace(settings),
        access_log_class=AccessLogger,
    )
    log.info("gateway.stopped")
