"""Staff roles: what an agent may do in the admin API, the console and the CLI, and the
rules that keep an admin account."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from aiohttp import ClientResponse, DummyCookieJar, web
from aiohttp.test_utils import TestClient, TestServer, make_mocked_request

from core.keyring import Keyring
from core.retrieval.embedders import UseEmbedder
from core.settings import Settings
from core.store import Database
from core.store.agents import Agents
from core.store.migrate import bundled_migrations, migrate
from core.store.staff import StaffAccounts
from core.store.vector_index import EmbedderIdentity
from gateway.admin.api import OPERATIONS, Operation
from gateway.admin.console import pages
from gateway.admin.openapi import openapi_document
from gateway.app import create_app
from gateway.keys import ADMIN, DATABASE
from tests.conftest import MakeSettings
from tests.support.cli import run_parley
from tests.support.console import TOKEN, Seeded, csrf_of, form_token_of, seed

Client = TestClient[web.Request, web.Application]

PASSWORD = "correct horse battery staple"
ADMIN_EMAIL = "ada@shop.example"
AGENT_EMAIL = "sam@shop.example"
API = "/api/v1/admin"
GUARDED = [op for op in OPERATIONS if not op.public]
ADMIN_ONLY = {
    ("GET", "/staff"),
    ("PATCH", r"/staff/{id:\d+}"),
    ("PATCH", "/agents/{agent}"),
    ("POST", "/agents/{agent}/widget-key"),
    ("GET", "/inbox"),
    ("POST", "/inbox/retry"),
    ("GET", "/agents/{agent}/sources"),
    ("POST", "/agents/{agent}/sources"),
    ("GET", r"/agents/{agent}/sources/{id:\d+}"),
    ("POST", r"/agents/{agent}/sources/{id:\d+}/reindex"),
    ("DELETE", r"/agents/{agent}/sources/{id:\d+}"),
    ("PATCH", r"/agents/{agent}/sources/{id:\d+}"),
    ("GET", r"/agents/{agent}/sources/{id:\d+}/pages"),
    ("PATCH", r"/agents/{agent}/pages/{page:\d+}"),
    ("GET", "/notifications"),
    ("POST", "/agents/{agent}/customers/erase"),
    ("GET", "/agents/{agent}/customers/export"),
}


def _path(template: str, agent: str = "shop", item: int = 999_999) -> str:
    path = template.replace("{agent}", agent)
    return re.sub(r"\{(id|page)(:[^}]*)?\}", str(item), path)


class Session:
    """A staff member signed in to the admin API with a password: its cookie and CSRF token."""

    def __init__(self, client: Client, cookie: str, csrf: str) -> None:
        self.client, self.cookie, self.csrf = client, cookie, csrf

    async def call(self, method: str, path: str, json: Any = None) -> ClientResponse:
        headers = {"Cookie": f"parley_admin={self.cookie}", "X-CSRF-Token": self.csrf}
        return await self.client.request(method, API + path, json=json, headers=headers)


async def _signed_in(client: Client, email: str) -> Session:
    response = await client.post(f"{API}/sign-in", json={"email": email, "password": PASSWORD})
    assert response.status == 200, await response.text()
    body = await response.json()
    return Session(client, response.cookies["parley_admin"].value, body["csrf_token"])


@pytest.fixture
async def api(
    make_settings: MakeSettings, use_embedder: UseEmbedder
) -> AsyncIterator[tuple[Client, StaffAccounts]]:
    """A gateway with an agent "shop", an admin account and an agent account."""
    settings = make_settings(admin_token=TOKEN)
    client: Client = TestClient(TestServer(create_app(settings)), cookie_jar=DummyCookieJar())
    await client.start_server()
    pool = client.server.app[DATABASE].pool
    agents = Agents(pool, keyring=Keyring.from_settings(settings))
    await agents.create("shop", embedder=EmbedderIdentity.of(use_embedder))
    accounts = StaffAccounts(pool)
    await accounts.create(ADMIN_EMAIL, PASSWORD)  # the first account: an admin
    await accounts.create(AGENT_EMAIL, PASSWORD)  # then agents, unless said otherwise
    yield client, accounts
    await client.close()


# -- the admin API --------------------------------------------------------------------------


def test_every_operation_names_its_role_and_the_admin_only_ones_are_these() -> None:
    assert {(op.method, op.path) for op in GUARDED if op.role == "admin"} == ADMIN_ONLY
    document = openapi_document()
    for op in GUARDED:
        described = document["paths"][op.route.replace(r":\d+", "")][op.method.lower()]
        assert described["x-parley-role"] == op.role
        assert described["description"].startswith(f"Role: {op.role}")
        refused = described["responses"]["403"]["description"]
        assert ("admin role" in refused) == (op.role == "admin"), op.name


@pytest.mark.parametrize("op", GUARDED, ids=lambda op: f"{op.method} {op.path}")
async def test_an_agent_is_refused_exactly_the_admin_only_operations(
    api: tuple[Client, StaffAccounts], op: Operation
) -> None:
    client, _ = api
    agent = await _signed_in(client, AGENT_EMAIL)
    body = {} if op.body is not None else None
    response = await agent.call(op.method, _path(op.path), body)
    if op.role == "admin":
        assert response.status == 403, await response.text()
        error = (await response.json())["error"]
        assert error["code"] == "role_required"
        assert error["message"] == (
            f"{op.method} {op.route} needs the admin role; you are signed in as agent"
        )
        # An admin account, and the admin token, are let through the same request.
        admin = await _signed_in(client, ADMIN_EMAIL)
        again = await admin.call(op.method, _path(op.path), body)
        assert again.status != 403, await again.text()
        bearer = await client.request(
            op.method, API + _path(op.path), json=body, headers={"Authorization": f"Bearer {TOKEN}"}
        )
        assert bearer.status != 403, await bearer.text()
    else:
        assert response.status != 403, await response.text()
        assert response.status < 500


async def test_an_agent_changes_nothing_it_may_not(api: tuple[Client, StaffAccounts]) -> None:
    client, _ = api
    agent = await _signed_in(client, AGENT_EMAIL)
    patched = await agent.call("PATCH", "/agents/shop", {"persona": "A pirate."})
    assert patched.status == 403
    added = await agent.call("POST", "/agents/shop/sources", {"kind": "text", "text": "Hi."})
    assert added.status == 403
    pool = client.server.app[DATABASE].pool
    assert await pool.fetchval("SELECT persona FROM agents WHERE slug = 'shop'") != "A pirate."
    assert await pool.fetchval("SELECT count(*) FROM sources") == 0
    me = await agent.call("GET", "/me")
    assert (await me.json())["staff"]["role"] == "agent"
    # What an agent does: a curated answer, made and listed.
    made = await agent.call(
        "POST", "/agents/shop/curated", {"question": "Opening hours?", "answer": "9 to 5."}
    )
    assert made.status == 201, await made.text()
    listed = await agent.call("GET", "/agents/shop/curated")
    assert [e["answer"] for e in (await listed.json())["items"]] == ["9 to 5."]


async def test_no_account_raises_its_own_role_or_removes_the_last_admin(
    api: tuple[Client, StaffAccounts],
) -> None:
    client, accounts = api
    members = {m.email: m for m in await accounts.list()}
    ada, sam = members[ADMIN_EMAIL], members[AGENT_EMAIL]
    assert (ada.role, sam.role) == ("admin", "agent")
    agent = await _signed_in(client, AGENT_EMAIL)
    raised = await agent.call("PATCH", f"/staff/{sam.id}", {"role": "admin"})
    assert raised.status == 403
    assert (await accounts.get(sam.id)).role == "agent"

    admin = await _signed_in(client, ADMIN_EMAIL)
    own = await admin.call("PATCH", f"/staff/{ada.id}", {"role": "agent"})
    assert own.status == 409
    assert (await own.json())["error"]["message"] == (
        "you cannot change your own role; another admin can"
    )
    # The admin token is no account: it may try, but the last admin account stays one.
    bearer = {"Authorization": f"Bearer {TOKEN}"}
    for change in ({"role": "agent"}, {"disabled": True}):
        last = await client.patch(f"{API}/staff/{ada.id}", json=change, headers=bearer)
        assert last.status == 409, await last.text()
        message = (await last.json())["error"]["message"]
        assert "ada@shop.example: it is the last admin account" in message
        assert "make another account an admin first" in message
    assert (await accounts.get(ada.id)).role == "admin"
    assert not (await accounts.get(ada.id)).disabled

    # With a second admin, the first may be made an agent; it is one from its next request.
    promoted = await admin.call("PATCH", f"/staff/{sam.id}", {"role": "admin"})
    assert promoted.status == 200
    assert (await promoted.json())["role"] == "admin"
    sam_admin = await _signed_in(client, AGENT_EMAIL)
    assert (await sam_admin.call("PATCH", f"/staff/{ada.id}", {"role": "agent"})).status == 200
    assert (await admin.call("GET", "/staff")).status == 403
    assert (await admin.call("GET", "/conversations")).status == 200


# -- long-lived requests --------------------------------------------------------------------

# Seconds a stream of an account that was disabled may take to end: it checks every few.
STREAM_END = 15.0


async def _open_events(session: Session) -> ClientResponse:
    """The console's live count (`GET /admin/events/waiting`), opened with the session."""
    response = await session.client.get(
        "/admin/events/waiting", headers={"Cookie": f"parley_admin={session.cookie}"}
    )
    assert response.status == 200, await response.text()
    assert await response.content.readline() == b"retry: 3000\n"
    return response


async def _ended(response: ClientResponse) -> None:
    """Read the stream to its end, which must come within ``STREAM_END``."""
    async with asyncio.timeout(STREAM_END):
        while await response.content.readline():
            pass


async def test_disabling_an_account_ends_its_open_streams(
    api: tuple[Client, StaffAccounts],
) -> None:
    """The console's live count and the conversation list's long poll were checked when they
    opened; they look again every few seconds and end once the account is disabled."""
    client, accounts = api
    sam = next(m for m in await accounts.list() if m.email == AGENT_EMAIL)
    agent = await _signed_in(client, AGENT_EMAIL)
    events = await _open_events(agent)
    version = (await (await agent.call("GET", "/conversations/changes?wait=0")).json())["version"]
    waiting = asyncio.create_task(
        agent.call("GET", f"/conversations/changes?since={version}&wait=25")
    )
    bearer = {"Authorization": f"Bearer {TOKEN}"}
    disabled = await client.patch(f"{API}/staff/{sam.id}", json={"disabled": True}, headers=bearer)
    assert disabled.status == 200, await disabled.text()
    await _ended(events)
    async with asyncio.timeout(STREAM_END):
        changes = await waiting
    assert changes.status == 401
    assert "session has ended" in (await changes.json())["error"]["message"]


async def test_parley_staff_disable_ends_the_accounts_streams(
    api: tuple[Client, StaffAccounts], database_url: str, tmp_path: Path
) -> None:
    client, _ = api
    events = await _open_events(await _signed_in(client, AGENT_EMAIL))
    disabled = run_parley(
        "staff", "disable", AGENT_EMAIL, cwd=tmp_path, PARLEY_DATABASE_URL=database_url
    )
    assert disabled.returncode == 0, disabled.stderr
    await _ended(events)


async def test_streams_are_held_to_the_role_they_need_as_it_changes(
    api: tuple[Client, StaffAccounts],
) -> None:
    """What the streams ask every few seconds: whether the request's session is still live
    and its account's role still allows what the stream needs. A demoted admin keeps the
    agents' streams (all the streams there are) and would lose one only admins may read."""
    client, accounts = api
    members = {m.email: m for m in await accounts.list()}
    await accounts.set_role(AGENT_EMAIL, "admin")  # a second admin, so the first may go
    ada = await _signed_in(client, ADMIN_EMAIL)
    auth = client.server.app[ADMIN].auth
    request = make_mocked_request(
        "GET", "/admin/events/waiting", headers={"Cookie": f"parley_admin={ada.cookie}"}
    )
    assert await auth.still_allowed(request, "admin")
    await accounts.set_role(members[ADMIN_EMAIL].id, "agent")
    assert not await auth.still_allowed(request, "admin")
    assert await auth.still_allowed(request, "agent")
    await accounts.set_disabled(members[ADMIN_EMAIL].id, True)
    assert not await auth.still_allowed(request, "agent")
    token = make_mocked_request("GET", "/", headers={"Authorization": f"Bearer {TOKEN}"})
    assert await auth.still_allowed(token, "admin")


# -- the console ----------------------------------------------------------------------------


async def _console_sign_in(client: Client, email: str) -> str:
    """Sign a browser in with a password; returns the CSRF token of its pages."""
    page = await client.get("/admin/sign-in")
    form = {"form_token": form_token_of(await page.text()), "email": email, "password": PASSWORD}
    signed = await client.post("/admin/sign-in", data=form, allow_redirects=False)
    assert signed.status == 303
    return csrf_of(await (await client.get("/admin/conversations")).text())


@pytest.fixture
async def console(
    make_settings: MakeSettings,
    settings: Settings,
    database: Database,
    cache: Any,
    use_embedder: UseEmbedder,
    tmp_path: Path,
) -> AsyncIterator[tuple[Client, Seeded]]:
    """The seeded console, with an admin account and an agent account."""
    data = await seed(settings, database, cache, use_embedder, tmp_path)
    accounts = StaffAccounts(database.pool)
    await accounts.create(ADMIN_EMAIL, PASSWORD, role="admin")
    await accounts.create(AGENT_EMAIL, PASSWORD, display_name="Sam", role="agent")
    client: Client = TestClient(TestServer(create_app(make_settings(admin_token=TOKEN))))
    await client.start_server()
    yield client, data
    await client.close()


async def test_an_agent_sees_no_links_to_admin_pages_and_gets_403_pages(
    console: tuple[Client, Seeded],
) -> None:
    agent, data = console
    shop = f"/admin/agents/{data.agent.slug}"
    csrf = await _console_sign_in(agent, AGENT_EMAIL)
    html = await (await agent.get(f"{shop}/gaps")).text()
    assert "Sam" in html
    assert "(agent)" in html
    for hidden in ('href="/admin/inbox"', f'href="{shop}/sources"', f'href="{shop}/settings"'):
        assert hidden not in html
    for shown in ("/gaps", "/curated", "/checks", "/playground"):
        assert f'href="{shop}{shown}"' in html
    agents = await (await agent.get("/admin/agents")).text()
    assert f'href="{shop}/sources"' not in agents
    assert f'href="{shop}/gaps"' in agents
    home = await agent.get(shop, allow_redirects=False)
    assert home.headers["Location"] == f"{shop}/gaps"

    for path in (f"{shop}/settings", f"{shop}/sources", "/admin/inbox"):
        refused = await agent.get(path)
        assert refused.status == 403, path
        text = await refused.text()
        assert "This page is for staff with the admin role; you are signed in as agent" in text
    before = await agent.server.app[DATABASE].pool.fetchval("SELECT count(*) FROM sources")
    for path, form in (
        (f"{shop}/settings", {"name": "Pirate Shop"}),
        (f"{shop}/settings/channels", {"telegram_remove": "on"}),
        (f"{shop}/settings/widget-key", {}),
        (f"{shop}/sources", {"kind": "url", "url": "https://shop.example/"}),
        (f"{shop}/sources/{data.failed_source_id}/remove", {}),
        ("/admin/inbox/retry", {"ids": "1"}),
    ):
        posted = await agent.post(path, data={"csrf_token": csrf, **form}, allow_redirects=False)
        assert posted.status == 403, path
    pool = agent.server.app[DATABASE].pool
    assert await pool.fetchval("SELECT count(*) FROM sources") == before
    stored = await pool.fetchrow(
        "SELECT name, widget_key, settings FROM agents WHERE slug = 'shop'"
    )
    assert stored["name"] == data.agent.name
    assert stored["widget_key"] == data.agent.widget_key
    assert "telegram" in stored["settings"]

    # An admin account sees and opens them all.
    admin = agent
    admin.session.cookie_jar.clear()
    await _console_sign_in(admin, ADMIN_EMAIL)
    page = await (await admin.get(f"{shop}/gaps")).text()
    for shown in ('href="/admin/inbox"', f'href="{shop}/sources"', f'href="{shop}/settings"'):
        assert shown in page
    for path in (f"{shop}/settings", f"{shop}/sources", "/admin/inbox"):
        assert (await admin.get(path)).status == 200, path


async def test_every_console_route_names_its_role_and_an_agent_is_held_to_it(
    console: tuple[Client, Seeded],
) -> None:
    agent, data = console
    csrf = await _console_sign_in(agent, AGENT_EMAIL)
    admin_only = {(r.method, r.path) for r in pages() if r.role == "admin"}
    assert admin_only == {
        ("GET", "/admin/inbox"),
        ("POST", "/admin/inbox/retry"),
        ("GET", "/admin/agents/{agent}/privacy"),
        ("GET", "/admin/agents/{agent}/privacy/export"),
        ("POST", "/admin/agents/{agent}/privacy/erase"),
        ("GET", "/admin/agents/{agent}/settings"),
        ("POST", "/admin/agents/{agent}/settings"),
        ("POST", "/admin/agents/{agent}/settings/channels"),
        ("POST", "/admin/agents/{agent}/settings/exploration"),
        ("POST", "/admin/agents/{agent}/settings/templates"),
        ("POST", "/admin/agents/{agent}/settings/widget-key"),
        ("GET", "/admin/agents/{agent}/sources"),
        ("POST", "/admin/agents/{agent}/sources"),
        ("POST", r"/admin/agents/{agent}/sources/{id:\d+}/reindex"),
        ("POST", r"/admin/agents/{agent}/sources/{id:\d+}/remove"),
        ("GET", r"/admin/agents/{agent}/sources/{id:\d+}"),
        ("POST", r"/admin/agents/{agent}/sources/{id:\d+}/tags"),
        ("POST", r"/admin/agents/{agent}/sources/{id:\d+}/pages/{page:\d+}/tags"),
    }
    for route in pages():
        if route.role is None or route.path == "/admin/sign-out":
            continue
        path = _path(route.path, data.agent.slug)
        if route.method == "GET":
            response = await agent.get(path, allow_redirects=False)
        else:
            response = await agent.post(path, data={"csrf_token": csrf}, allow_redirects=False)
        refused = response.status == 403
        assert refused == (route.role == "admin"), (route.method, route.path, response.status)


# -- the CLI and the migration --------------------------------------------------------------


def test_parley_staff_add_gives_roles_and_keeps_the_last_admin(
    database_url: str, tmp_path: Path
) -> None:
    def parley(*args: str) -> Any:
        return run_parley(
            "staff", *args, cwd=tmp_path, PARLEY_DATABASE_URL=database_url,
            PARLEY_DATA_DIR=str(tmp_path / "data"), PARLEY_STAFF_PASSWORD=PASSWORD,
        )  # fmt: skip

    first = parley("add", "ada@shop.example", "--name", "Ada")
    assert first.returncode == 0, first.stderr
    assert first.stdout.strip() == "created staff account ada@shop.example (Ada), role admin"
    second = parley("add", "sam@shop.example", "--name", "Sam")
    assert second.stdout.strip() == "created staff account sam@shop.example (Sam), role agent"
    third = parley("create", "kim@shop.example", "--name", "Kim", "--role", "admin")
    assert third.stdout.strip() == "created staff account kim@shop.example (Kim), role admin"
    wrong = parley("add", "lee@shop.example", "--role", "owner")
    assert wrong.returncode == 2
    assert "invalid choice: 'owner'" in wrong.stderr

    assert parley("role", "kim@shop.example", "agent").stdout.strip() == (
        "kim@shop.example is now agent"
    )
    last = parley("role", "ada@shop.example", "agent")
    assert last.returncode == 2
    assert "cannot make an agent ada@shop.example: it is the last admin account" in last.stderr
    disabled = parley("disable", "ada@shop.example")
    assert disabled.returncode == 2
    assert "cannot disable ada@shop.example: it is the last admin account" in disabled.stderr
    assert parley("role", "sam@shop.example", "admin").returncode == 0
    assert parley("role", "ada@shop.example", "agent").returncode == 0

    listed = [line.split("\t")[:4] for line in parley("list").stdout.splitlines()]
    assert listed == [
        ["ada@shop.example", "Ada", "active", "agent"],
        ["kim@shop.example", "Kim", "active", "agent"],
        ["sam@shop.example", "Sam", "active", "admin"],
    ]


async def test_the_migration_makes_existing_accounts_admins(fresh_database: str) -> None:
    migrations = bundled_migrations()
    before = [m for m in migrations if m.version < 11]
    assert [m.name for m in migrations if m.version == 11] == ["staff_roles"]
    conn = await asyncpg.connect(fresh_database)
    try:
        await migrate(conn, before)
        await conn.execute(
            """INSERT INTO staff (email, password_hash) VALUES
                   ('ada@shop.example', 'x'), ('sam@shop.example', 'x')"""
        )
        assert await migrate(conn, migrations) == [m.version for m in migrations[len(before) :]]
        roles = await conn.fetch("SELECT email, role FROM staff ORDER BY email")
        assert [(r["email"], r["role"]) for r in roles] == [
            ("ada@shop.example", "admin"),
            ("sam@shop.example", "admin"),
        ]
        await conn.execute("INSERT INTO staff (email, password_hash) VALUES ('kim@shop.ex', 'x')")
        assert await conn.fetchval("SELECT role FROM staff WHERE email = 'kim@shop.ex'") == "agent"
        with pytest.raises(asyncpg.CheckViolationError):
            await conn.execute("UPDATE staff SET role = 'owner'")
    finally:
        await conn.close()
