"""Schemathesis against /api/v1/openapi.json: what the document promises, the gateway keeps.

The gateway built by create_app serves on a port of its own (on a thread with its own event
loop, since Schemathesis calls it synchronously), on real PostgreSQL and Redis. Every
operation of the document gets a bounded number of generated requests, from a fixed seed;
each response must be no server error and must match what the document says of it: status,
content type, headers and body (the JSON, or each event of a stream). Sources to crawl are
pointed at a small site on 127.0.0.1 instead of the URLs Schemathesis makes up.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import urllib.request
from collections.abc import Coroutine, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import urlsplit, urlunsplit

import pytest
import redis
import schemathesis
from aiohttp import web
from hypothesis import HealthCheck, settings
from schemathesis import Case
from schemathesis.config import SchemathesisConfig
from schemathesis.core.parameters import ParameterLocation

from core.settings import Settings
from core.store import Agents
from core.store.api_keys import ApiKeys
from core.store.vector_index import EmbedderIdentity
from gateway.admin.openapi import OPENAPI_PATH, openapi_document
from gateway.app import create_app
from gateway.keys import DATABASE, EMBEDDER
from tests.conftest import SECRETS_KEY
from tests.support.redis_keys import key_prefix
from tests.support.services import LOOPBACK, database_from_template, free_port

T = TypeVar("T")

TOKEN = "admin-token-for-schemathesis-0123456789"
AGENT = "shop"
HOST = "127.0.0.1"
# Generated requests per operation (the fuzzing phase); the other phases are bounded by
# the schema itself. Enough to find what a request of a given shape breaks, and quick.
EXAMPLES = 25
ANSWERS = 10  # for the operations that answer a question, which each take a moment
SEED = 20261201
# What refuses a request the document forbids: Schemathesis's own list, and 413 (a body too
# long for the schema may be too large for the gateway to read at all).
REFUSED = [400, 401, 403, 404, 405, 406, 409, 413, 415, 422, 428, 429, "5XX"]

PAGE = (
    "<html lang='en'><head><title>Delivery</title></head><body><main><h1>Delivery</h1>"
    "<p>Parcels to Belgium arrive within two to three working days.</p></main></body></html>"
)


class _Loop:
    """An event loop on a thread of its own, serving while Schemathesis blocks on a call."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self.loop.run_forever, name="schemathesis-app", daemon=True
        )
        self._thread.start()

    def run(self, work: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(work, self.loop).result(120)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join()
        self.loop.close()


@dataclass(frozen=True)
class Gateway:
    url: str
    site: str  # the local website sources are crawled from
    api_key: str
    redis: redis.Redis
    redis_prefix: str

    def credentials(self, case: Case) -> dict[str, str]:
        """The headers an operation authenticates with: the admin token, the agent's API key,
        or its widget key as it is now."""
        security = case.operation.definition.raw.get("security")
        if security == [{"widgetKey": []}]:
            return {"X-Parley-Key": self.widget_key()}
        if security == [{"apiKey": []}]:
            return {"Authorization": f"Bearer {self.api_key}"}
        return {"Authorization": f"Bearer {TOKEN}"}

    def widget_key(self) -> str:
        """The agent's widget key now (an operation of the document replaces it)."""
        request = urllib.request.Request(
            f"{self.url}/api/v1/admin/agents/{AGENT}", headers={"Authorization": f"Bearer {TOKEN}"}
        )
        with urllib.request.urlopen(request) as response:
            return str(json.load(response)["widget_key"])

    def forget_throttles(self) -> None:
        """Empty the gateway's part of Redis. Schemathesis sends wrong credentials on purpose,
        for every operation and from one address; the sign-in throttle would soon answer them
        with 429 instead of the 401 each one is owed, and rate limits would hide the rest."""
        _delete_keys(self.redis, self.redis_prefix)


def _delete_keys(client: redis.Redis, prefix: str) -> None:
    keys = list(client.scan_iter(match=f"{prefix}*", count=1000))
    if keys:
        client.delete(*keys)


async def _serve(app: web.Application, port: int) -> web.AppRunner:
    runner = web.AppRunner(app, handle_signals=False)
    await runner.setup()
    await web.TCPSite(runner, HOST, port).start()
    return runner


def _site() -> web.Application:
    async def page(request: web.Request) -> web.Response:
        return web.Response(text=PAGE, content_type="text/html")

    async def sitemap(request: web.Request) -> web.Response:
        base = f"http://{request.host}"
        xml = (
            '<?xml version="1.0" encoding="UTF-8"?>'
            '<urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9">'
            f"<url><loc>{base}/delivery</loc></url></urlset>"
        )
        return web.Response(text=xml, content_type="application/xml")

    app = web.Application()
    app.router.add_get("/sitemap.xml", sitemap)
    app.router.add_get("/delivery", page)
    app.router.add_get("/", page)
    return app


@pytest.fixture(scope="module")
def gateway_database(postgres_url: str, template_database: str) -> Iterator[str]:
    """A migrated database shared by this module's tests: one gateway serves them all."""
    with database_from_template(postgres_url, template_database) as database:
        yield database


@pytest.fixture(scope="module")
def gateway(
    gateway_database: str, redis_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Gateway]:
    prefix = key_prefix()
    settings = Settings(  # type: ignore[call-arg]
        _env_file=None,
        database_url=gateway_database,
        redis_url=redis_url,
        redis_prefix=prefix,
        data_dir=tmp_path_factory.mktemp("schemathesis"),
        crawl_allow_networks=list(LOOPBACK),
        secrets_key=SECRETS_KEY,  # channel secrets set through PATCH are stored
        admin_token=TOKEN,
    )
    app = create_app(settings)
    port, site_port = free_port(), free_port()

    async def seed() -> str:
        pool = app[DATABASE].pool
        agent = await Agents(pool).create(
            AGENT, embedder=EmbedderIdentity.of(app[EMBEDDER]), name="The Shop"
        )
        return await ApiKeys(pool).create(agent.id, "schemathesis")

    with contextlib.ExitStack() as stack:
        client = stack.enter_context(contextlib.closing(redis.Redis.from_url(redis_url)))
        stack.callback(_delete_keys, client, prefix)  # what is left once the gateway stopped
        loop = _Loop()
        stack.callback(loop.close)
        runner = loop.run(_serve(app, port))
        stack.callback(lambda: loop.run(runner.cleanup()))
        site = loop.run(_serve(_site(), site_port))
        stack.callback(lambda: loop.run(site.cleanup()))
        yield Gateway(
            f"http://{HOST}:{port}", f"http://{HOST}:{site_port}", loop.run(seed()), client, prefix
        )


# The document the gateway serves at /api/v1/openapi.json (the first test checks that it is
# this very one); read here so that each operation is a test of its own.
schema = schemathesis.openapi.from_dict(
    openapi_document(),
    config=SchemathesisConfig.from_dict(
        {
            "seed": SEED,
            "generation": {"max-examples": EXAMPLES, "deterministic": True, "database": "none"},
            # Operations that name an agent name the one that exists, so their handlers run.
            "parameters": {"path.agent": AGENT},
            "request-timeout": 30,
            "max-stream-events": 50,
            "checks": {
                # The bodies have rules a JSON Schema does not carry (a token, or an email
                # address and a password; a pattern that compiles; a url for a url source;
                # no NUL character): a request the document allows may still be refused, with
                # a 400 naming the rule. What the document forbids must be refused (the
                # negative_data_rejection check), and that is checked.
                "positive_data_acceptance": {"enabled": False},
                "negative_data_rejection": {
                    "expected-statuses": REFUSED,
                },
            },
            "operations": [
                {
                    "include-path": "/api/v1/agents/{agent}/conversations/events",
                    # DELETE /api/v1/agents/{agent}/conversations/{conversation_key} takes the
                    # key "events" too: Allow names DELETE for this path, rightly.
                    "checks": {"allow_header_conformance": {"enabled": False}},
                    # The stream stays open (for half an hour): its first event is read.
                    "max-stream-events": 1,
                },
                {
                    # Each request the document allows is answered (extractively, a few words
                    # at a time): fewer of those, and of the boundary values only the ones
                    # that must be refused.
                    "include-path-regex": "(/(playground|chat|turns)|:process)$",
                    "generation": {"max-examples": ANSWERS},
                    "phases": {"coverage": {"generation": {"mode": "negative"}}},
                },
            ],
        }
    ),
)


def test_the_document_is_the_one_served(gateway: Gateway) -> None:
    with urllib.request.urlopen(gateway.url + OPENAPI_PATH) as response:
        assert json.load(response) == openapi_document()


def _local(url: Any, site: str) -> Any:
    """``url`` on the local site: same path and query, so nothing is fetched from elsewhere."""
    if not isinstance(url, str) or not url.lower().startswith(("http://", "https://")):
        return url
    local = urlsplit(site)
    try:
        return urlunsplit(urlsplit(url)._replace(scheme=local.scheme, netloc=local.netloc))
    except ValueError:  # not even a URL (say, "http://[::1"): the site's start page
        return site + "/"


@schema.parametrize()
@settings(
    derandomize=True,
    deadline=None,
    suppress_health_check=list(HealthCheck),
)
def test_the_gateway_keeps_to_its_openapi_document(case: Case, gateway: Gateway) -> None:
    gateway.forget_throttles()
    adds_source = case.operation.label == "POST /api/v1/admin/agents/{agent}/sources"
    if adds_source and isinstance(case.body, dict) and "url" in case.body:
        case.body["url"] = _local(case.body["url"], gateway.site)
    # Real credentials, so that the operations run; unless the case's headers are wrong on
    # purpose (missing or malformed credentials must be refused). Schemathesis also checks
    # each operation without them, and with made-up ones.
    negative_headers = case.meta is not None and case.meta.is_negative_at(ParameterLocation.HEADER)
    headers = {} if negative_headers else gateway.credentials(case)
    if isinstance(case.query, dict) and "key" in case.query:
        case.query["key"] = gateway.widget_key()  # the live stream's, in the query string
    response = case.call_and_validate(base_url=gateway.url, headers=headers)
    if adds_source and response.status_code == 202:
        # What is crawled is the local site (or a text source's own path).
        assert response.json()["location"].startswith((gateway.site + "/", "/"))
