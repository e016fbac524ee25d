"""Staff authentication: the admin token, staff passwords, session cookies and CSRF tokens."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from http.cookies import SimpleCookie
from pathlib import Path
from typing import Any

import pytest
from aiohttp import DummyCookieJar, web
from aiohttp.test_utils import TestClient, TestServer

from core.store.staff import StaffAccounts
from gateway.app import create_app
from gateway.keys import DATABASE
from tests.conftest import MakeSettings
from tests.support.cli import run_parley

Client = TestClient[web.Request, web.Application]
StartClient = Callable[..., Awaitable[Client]]

TOKEN = "admin-token-for-tests-0123456789"
PASSWORD = "correct horse battery staple"
ADMIN = "/api/v1/admin"


@pytest.fixture
async def start_client(make_settings: MakeSettings) -> AsyncIterator[StartClient]:
    """A gateway built by create_app with the given settings, and a client without cookies
    of its own: each test says which cookie it sends."""
    clients: list[Client] = []

    async def start(**settings: Any) -> Client:
        server = TestServer(create_app(make_settings(**settings)))
        client = TestClient(server, cookie_jar=DummyCookieJar())
        await client.start_server()
        clients.append(client)
        return client

    yield start
    for client in clients:
        await client.close()


def _staff(client: Client) -> StaffAccounts:
    return StaffAccounts(client.server.app[DATABASE].pool)


def _set_cookie(response: Any) -> SimpleCookie:
    cookie: SimpleCookie = SimpleCookie()
    for header in response.headers.getall("Set-Cookie"):
        cookie.load(header)
    return cookie


async def _sign_in(client: Client, **body: str) -> tuple[str, str]:
    """Sign in; returns the session cookie's value and the CSRF token."""
    response = await client.post(f"{ADMIN}/sign-in", json=body)
    assert response.status == 200, await response.text()
    cookie = _set_cookie(response)["parley_admin"].value
    return cookie, (await response.json())["csrf_token"]


async def test_no_credentials_is_401_with_the_json_error_body(start_client: StartClient) -> None:
    client = await start_client(admin_token=TOKEN)
    response = await client.get(f"{ADMIN}/agents")
    assert response.status == 401
    assert response.headers["WWW-Authenticate"].startswith("Bearer")
    body = await response.json()
    assert body["error"]["code"] == "unauthorized"
    assert "Authorization: Bearer" in body["error"]["message"]


async def test_a_wrong_or_malformed_token_is_refused(start_client: StartClient) -> None:
    client = await start_client(admin_token=TOKEN)
    wrong = await client.get(f"{ADMIN}/agents", headers={"Authorization": "Bearer nope"})
    assert wrong.status == 401
    assert (await wrong.json())["error"] == {
        "code": "unauthorized",
        "message": "wrong admin token",
    }
    basic = await client.get(f"{ADMIN}/agents", headers={"Authorization": f"Basic {TOKEN}"})
    assert basic.status == 401
    right = await client.get(f"{ADMIN}/agents", headers={"Authorization": f"Bearer {TOKEN}"})
    assert right.status == 200
    assert await right.json() == {"items": []}


async def test_a_bearer_token_needs_no_csrf_token(start_client: StartClient) -> None:
    client = await start_client(admin_token=TOKEN)
    response = await client.post(f"{ADMIN}/sign-out", headers={"Authorization": f"Bearer {TOKEN}"})
    assert response.status == 204


async def test_without_token_or_staff_the_admin_side_says_it_is_disabled(
    start_client: StartClient,
) -> None:
    client = await start_client()
    for response in (
        await client.get(f"{ADMIN}/agents"),
        await client.post(f"{ADMIN}/sign-in", json={"email": "a@b.example", "password": "x"}),
    ):
        assert response.status == 503
        error = (await response.json())["error"]
        assert error["code"] == "admin_disabled"
        assert "PARLEY_ADMIN_TOKEN" in error["message"]
        assert "parley staff create" in error["message"]
    # With a staff account it is enabled, and without a configured token a Bearer is refused.
    await _staff(client).create("ann@shop.example", PASSWORD)
    response = await client.get(f"{ADMIN}/agents", headers={"Authorization": "Bearer x"})
    assert response.status == 401


async def test_the_session_cookie_is_httponly_strict_and_not_secure_over_http(
    start_client: StartClient,
) -> None:
    client = await start_client(admin_token=TOKEN, public_url="http://gateway.example")
    response = await client.post(f"{ADMIN}/sign-in", json={"token": TOKEN})
    assert response.status == 200
    morsel = _set_cookie(response)["parley_admin"]
    assert len(morsel.value) >= 40
    assert morsel["httponly"] is True
    assert morsel["samesite"] == "Strict"
    assert morsel["path"] == "/"
    assert not morsel["secure"]
    assert int(morsel["max-age"]) == 12 * 3600
    body = await response.json()
    assert body["staff"] == {
        "id": None,
        "email": None,
        "name": "Admin",
        "via": "session",
        "role": "admin",
    }
    assert len(body["csrf_token"]) >= 40


async def test_the_session_cookie_is_secure_behind_https(start_client: StartClient) -> None:
    client = await start_client(admin_token=TOKEN, public_url="https://gateway.example")
    response = await client.post(f"{ADMIN}/sign-in", json={"token": TOKEN})
    morsel = _set_cookie(response)["parley_admin"]
    assert morsel["secure"] is True
    assert morsel["httponly"] is True
    assert morsel["samesite"] == "Strict"


async def test_sign_in_with_a_wrong_token_sets_no_cookie(start_client: StartClient) -> None:
    client = await start_client(admin_token=TOKEN)
    response = await client.post(f"{ADMIN}/sign-in", json={"token": "wrong"})
    assert response.status == 401
    assert "Set-Cookie" not in response.headers
    empty = await client.post(f"{ADMIN}/sign-in", json={})
    assert empty.status == 400
    assert "token" in (await empty.json())["error"]["message"]


async def test_state_changes_with_a_session_need_its_csrf_token(start_client: StartClient) -> None:
    client = await start_client(admin_token=TOKEN)
    session, csrf = await _sign_in(client, token=TOKEN)
    other_session, other_csrf = await _sign_in(client, token=TOKEN)
    cookie = {"Cookie": f"parley_admin={session}"}

    me = await client.get(f"{ADMIN}/me", headers=cookie)
    assert me.status == 200
    assert (await me.json())["csrf_token"] == csrf

    missing = await client.post(f"{ADMIN}/sign-out", headers=cookie)
    assert missing.status == 403
    assert (await missing.json())["error"]["code"] == "csrf_failed"
    wrong = await client.post(f"{ADMIN}/sign-out", headers=cookie | {"X-CSRF-Token": "x" * 43})
    assert wrong.status == 403
    # Another session's token is a real token, but not this session's.
    crossed = await client.post(f"{ADMIN}/sign-out", headers=cookie | {"X-CSRF-Token": other_csrf})
    assert crossed.status == 403
    # A console form sends it as a field instead of a header.
    form = await client.post(f"{ADMIN}/sign-out", headers=cookie, data={"csrf_token": "not-it"})
    assert form.status == 403

    signed_out = await client.post(f"{ADMIN}/sign-out", headers=cookie | {"X-CSRF-Token": csrf})
    assert signed_out.status == 204
    cleared = _set_cookie(signed_out)["parley_admin"]
    assert cleared.value == ""
    after = await client.get(f"{ADMIN}/me", headers=cookie)
    assert after.status == 401
    assert "session has ended" in (await after.json())["error"]["message"]
    # The other session was not touched, and its form field is accepted.
    still = await client.post(
        f"{ADMIN}/sign-out",
        headers={"Cookie": f"parley_admin={other_session}"},
        data={"csrf_token": other_csrf},
    )
    assert still.status == 204


async def test_an_expired_session_is_refused(start_client: StartClient) -> None:
    client = await start_client(admin_token=TOKEN)
    session, _ = await _sign_in(client, token=TOKEN)
    cookie = {"Cookie": f"parley_admin={session}"}
    assert (await client.get(f"{ADMIN}/me", headers=cookie)).status == 200
    pool = client.server.app[DATABASE].pool
    await pool.execute("UPDATE staff_sessions SET expires_at = now() - interval '1 second'")
    assert (await client.get(f"{ADMIN}/me", headers=cookie)).status == 401


async def test_a_token_session_ends_when_the_token_is_changed(start_client: StartClient) -> None:
    before = await start_client(admin_token=TOKEN)
    session, _ = await _sign_in(before, token=TOKEN)
    cookie = {"Cookie": f"parley_admin={session}"}
    same = await start_client(admin_token=TOKEN)
    assert (await same.get(f"{ADMIN}/me", headers=cookie)).status == 200
    changed = await start_client(admin_token=TOKEN + "-new")
    assert (await changed.get(f"{ADMIN}/me", headers=cookie)).status == 401
    # Without any token, staff accounts still work but no token session does.
    removed = await start_client()
    await _staff(removed).create("ann@shop.example", PASSWORD)
    assert (await removed.get(f"{ADMIN}/me", headers=cookie)).status == 401


async def test_a_new_password_ends_the_accounts_sessions(start_client: StartClient) -> None:
    client = await start_client(admin_token=TOKEN)
    accounts = _staff(client)
    await accounts.create("ann@shop.example", PASSWORD)
    await accounts.create("bob@shop.example", PASSWORD)
    ann, _ = await _sign_in(client, email="ann@shop.example", password=PASSWORD)
    bob, _ = await _sign_in(client, email="bob@shop.example", password=PASSWORD)
    await accounts.set_password("ann@shop.example", PASSWORD + " 2")
    assert (
        await client.get(f"{ADMIN}/me", headers={"Cookie": f"parley_admin={ann}"})
    ).status == 401
    assert (
        await client.get(f"{ADMIN}/me", headers={"Cookie": f"parley_admin={bob}"})
    ).status == 200
    await _sign_in(client, email="ann@shop.example", password=PASSWORD + " 2")


async def test_sessions_are_stored_hashed(start_client: StartClient) -> None:
    client = await start_client(admin_token=TOKEN)
    session, csrf = await _sign_in(client, token=TOKEN)
    row = await client.server.app[DATABASE].pool.fetchrow("SELECT * FROM staff_sessions")
    assert row is not None
    assert session.encode() not in bytes(row["token_hash"])
    assert len(row["token_hash"]) == 32  # sha256
    assert row["csrf_token"] == csrf
    assert TOKEN.encode() not in bytes(row["token_mac"])


async def test_passwords_are_argon2id_hashes_and_sign_staff_in(start_client: StartClient) -> None:
    client = await start_client(admin_token=TOKEN)
    member = await _staff(client).create("Ann@Shop.example", PASSWORD, display_name="Ann")
    assert member.email == "ann@shop.example"
    stored = await client.server.app[DATABASE].pool.fetchval("SELECT password_hash FROM staff")
    assert stored.startswith("$argon2id$v=19$m=65536,t=3,p=4$")
    assert PASSWORD not in stored

    wrong = await client.post(
        f"{ADMIN}/sign-in", json={"email": "ann@shop.example", "password": PASSWORD + "!"}
    )
    assert wrong.status == 401
    assert (await wrong.json())["error"]["message"] == "wrong email address or password"
    unknown = await client.post(
        f"{ADMIN}/sign-in", json={"email": "bob@shop.example", "password": PASSWORD}
    )
    assert unknown.status == 401
    assert (await unknown.json())["error"]["message"] == "wrong email address or password"

    session, _ = await _sign_in(client, email="ANN@shop.example", password=PASSWORD)
    me = await client.get(f"{ADMIN}/me", headers={"Cookie": f"parley_admin={session}"})
    assert (await me.json())["staff"] == {
        "id": member.id,
        "email": "ann@shop.example",
        "name": "Ann",
        "via": "session",
        "role": "admin",  # the first account
    }
    staff = await client.get(f"{ADMIN}/staff", headers={"Cookie": f"parley_admin={session}"})
    [listed] = (await staff.json())["items"]
    assert listed["email"] == "ann@shop.example"
    assert listed["last_sign_in_at"] is not None
    assert "password_hash" not in listed


async def test_a_disabled_account_is_signed_out_and_cannot_sign_in(
    start_client: StartClient,
) -> None:
    client = await start_client(admin_token=TOKEN)
    accounts = _staff(client)
    # An agent: the last admin account cannot be disabled (test_staff_roles.py).
    await accounts.create("ann@shop.example", PASSWORD, role="agent")
    session, _ = await _sign_in(client, email="ann@shop.example", password=PASSWORD)
    await accounts.set_disabled("ann@shop.example", True)
    assert (
        await client.get(f"{ADMIN}/me", headers={"Cookie": f"parley_admin={session}"})
    ).status == 401
    again = await client.post(
        f"{ADMIN}/sign-in", json={"email": "ann@shop.example", "password": PASSWORD}
    )
    assert again.status == 401


async def test_enabling_an_account_again_does_not_revive_its_old_sessions(
    start_client: StartClient,
) -> None:
    client = await start_client(admin_token=TOKEN)
    accounts = _staff(client)
    # An agent: the last admin account cannot be disabled (test_staff_roles.py).
    await accounts.create("ann@shop.example", PASSWORD, role="agent")
    session, _ = await _sign_in(client, email="ann@shop.example", password=PASSWORD)
    await accounts.set_disabled("ann@shop.example", True)
    pool = client.server.app[DATABASE].pool
    assert await pool.fetchval("SELECT count(*) FROM staff_sessions") == 0
    await accounts.set_disabled("ann@shop.example", False)
    old = await client.get(f"{ADMIN}/me", headers={"Cookie": f"parley_admin={session}"})
    assert old.status == 401
    fresh, _ = await _sign_in(client, email="ann@shop.example", password=PASSWORD)
    me = await client.get(f"{ADMIN}/me", headers={"Cookie": f"parley_admin={fresh}"})
    assert me.status == 200


async def test_short_passwords_are_refused(start_client: StartClient) -> None:
    client = await start_client(admin_token=TOKEN)
    with pytest.raises(Exception, match="at least 10 characters"):
        await _staff(client).create("ann@shop.example", "short")


# The test client connects from 127.0.0.1: as a trusted proxy, it says which address each
# request comes from.
PROXY = {"trusted_proxies": ["127.0.0.1/32"]}


async def _password(
    client: Client,
    password: str,
    address: str,
    email: str = "ann@shop.example",
    device: str | None = None,
) -> Any:
    """A password sign-in from ``address``, with a browser's device cookie when given."""
    headers = {"X-Forwarded-For": address}
    if device is not None:
        headers["Cookie"] = f"parley_device={device}"
    return await client.post(
        f"{ADMIN}/sign-in", json={"email": email, "password": password}, headers=headers
    )


async def test_failed_sign_ins_back_off_per_account_and_address(start_client: StartClient) -> None:
    client = await start_client(admin_token=TOKEN, **PROXY)
    await _staff(client).create("ann@shop.example", PASSWORD)
    guesses = [(await _password(client, f"guess-{n}", "203.0.113.9")).status for n in range(6)]
    assert guesses == [401] * 5 + [429]
    # From that address even the right password waits for its turn...
    right = await _password(client, PASSWORD, "203.0.113.9")
    assert right.status == 429
    assert right.headers["Retry-After"] == "1"
    assert (await right.json())["error"]["code"] == "rate_limited"
    # ...but the owner elsewhere is not kept out, nor is the admin token from that address.
    assert (await _password(client, PASSWORD, "198.51.100.7")).status == 200
    token = await client.post(
        f"{ADMIN}/sign-in", json={"token": TOKEN}, headers={"X-Forwarded-For": "203.0.113.9"}
    )
    assert token.status == 200

    # Each wait is twice the one before: the right password gets its turn 2 s after the
    # sixth wrong one (tries refused meanwhile do not count).
    await asyncio.sleep(1.1)
    sixth = time.monotonic()
    assert (await _password(client, "guess-6", "203.0.113.9")).status == 401
    while (answer := await _password(client, PASSWORD, "203.0.113.9")).status == 429:
        assert answer.headers["Retry-After"] in ("1", "2")
        await asyncio.sleep(0.2)
    assert answer.status == 200
    assert time.monotonic() - sixth >= 2.0
    # The right password cleared the back-off: five tries again.
    again = [(await _password(client, f"again-{n}", "203.0.113.9")).status for n in range(6)]
    assert again == [401] * 5 + [429]


async def test_wrong_passwords_from_many_addresses_do_not_lock_the_owner_out(
    start_client: StartClient,
) -> None:
    client = await start_client(admin_token=TOKEN, **PROXY)
    await _staff(client).create("ann@shop.example", PASSWORD)
    for n in range(11):
        assert (await _password(client, f"guess-{n}", f"203.0.113.{n + 1}")).status == 401
    assert (await _password(client, PASSWORD, "198.51.100.7")).status == 200


async def test_a_client_with_an_ipv6_prefix_is_one_client(start_client: StartClient) -> None:
    client = await start_client(admin_token=TOKEN, **PROXY)
    await _staff(client).create("ann@shop.example", PASSWORD)
    guesses = [(await _password(client, "guess", f"2001:db8:1:2::{n}")).status for n in range(6)]
    assert guesses == [401] * 5 + [429]
    assert (await _password(client, PASSWORD, "2001:db8:1:3::1")).status == 200


async def test_one_address_failing_at_many_accounts_is_limited(start_client: StartClient) -> None:
    client = await start_client(admin_token=TOKEN, **PROXY)
    await _staff(client).create("ann@shop.example", PASSWORD)
    statuses = [
        (await _password(client, "guess", "203.0.113.9", f"staff{n}@shop.example")).status
        for n in range(21)
    ]
    assert statuses == [401] * 20 + [429]
    assert (await _password(client, PASSWORD, "203.0.113.9")).status == 429
    assert (await _password(client, PASSWORD, "198.51.100.7")).status == 200


async def test_wrong_token_guesses_never_keep_the_right_token_out(
    start_client: StartClient,
) -> None:
    client = await start_client(admin_token=TOKEN)
    wrong = {"Authorization": "Bearer not-the-token"}
    statuses = [(await client.get(f"{ADMIN}/agents", headers=wrong)).status for _ in range(12)]
    assert statuses == [401] * 5 + [429] * 7
    right = await client.get(f"{ADMIN}/agents", headers={"Authorization": f"Bearer {TOKEN}"})
    assert right.status == 200
    assert (await client.post(f"{ADMIN}/sign-in", json={"token": TOKEN})).status == 200
    # Guessing still gets nowhere, and each right token still gets in.
    assert (await client.post(f"{ADMIN}/sign-in", json={"token": "not-it"})).status == 429
    for _ in range(3):
        again = await client.get(f"{ADMIN}/agents", headers={"Authorization": f"Bearer {TOKEN}"})
        assert again.status == 200


async def test_guessing_from_the_owners_address_never_keeps_the_owner_out(
    start_client: StartClient,
) -> None:
    """Wrong passwords from the address the owner signs in from, at her account and at many
    others, slow the guesser and not her: the browser she signed in with before carries a
    device cookie, and its tries are counted on their own. A client without one is still
    refused unread (right password or not) while the address is over its budget, so the
    guessing stays slowed."""
    client = await start_client(admin_token=TOKEN, **PROXY)
    await _staff(client).create("ann@shop.example", PASSWORD)
    await _staff(client).create("bob@shop.example", PASSWORD + " for bob")
    here = "203.0.113.9"
    first = await _password(client, PASSWORD, here)
    assert first.status == 200
    cookie = _set_cookie(first).get("parley_device")
    device = cookie.value if cookie is not None else None
    if cookie is not None:
        assert (cookie["httponly"], cookie["samesite"], cookie["path"]) == (True, "Strict", "/")
    ann = [(await _password(client, f"guess-{n}", here)).status for n in range(6)]
    assert ann == [401] * 5 + [429]
    others = [
        (await _password(client, "guess", here, f"staff{n}@shop.example")).status for n in range(20)
    ]
    assert others[-1] == 429  # the address's budget is spent
    assert (await _password(client, PASSWORD, here)).status == 429
    # Bob's device, a made-up one, or Ann's altered, are no way past.
    signed_bob = await _password(client, PASSWORD + " for bob", "198.51.100.7", "bob@shop.example")
    assert signed_bob.status == 200, await signed_bob.text()
    bob = _set_cookie(signed_bob)
    for other in (bob["parley_device"].value if "parley_device" in bob else None,
                  "1.4102444800.AAAA.AAAA", (device or "") + "x"):  # fmt: skip
        assert (await _password(client, PASSWORD, here, device=other)).status == 429

    for _ in range(3):
        right = await _password(client, PASSWORD, here, device=device)
        assert right.status == 200, await right.text()
    token = await client.post(
        f"{ADMIN}/sign-in", json={"token": TOKEN}, headers={"X-Forwarded-For": here}
    )
    assert token.status == 200
    bearer = {"Authorization": f"Bearer {TOKEN}", "X-Forwarded-For": here}
    assert (await client.get(f"{ADMIN}/agents", headers=bearer)).status == 200
    # The device's own wrong passwords back off as anyone's do, and only its own.
    mine = [(await _password(client, f"typo-{n}", here, device=device)).status for n in range(6)]
    assert mine == [401] * 5 + [429]


async def test_sign_in_must_be_sent_as_json(start_client: StartClient) -> None:
    client = await start_client(admin_token=TOKEN)
    body = json.dumps({"token": TOKEN})
    for content_type in (
        "text/plain",
        "application/x-www-form-urlencoded",
        "multipart/form-data; boundary=x",
    ):
        response = await client.post(
            f"{ADMIN}/sign-in", data=body, headers={"Content-Type": content_type}
        )
        assert response.status == 415, content_type
        assert (await response.json())["error"]["code"] == "unsupported_media_type"
        assert "Set-Cookie" not in response.headers
    sent_as_json = await client.post(
        f"{ADMIN}/sign-in", data=body, headers={"Content-Type": "application/json; charset=utf-8"}
    )
    assert sent_as_json.status == 200


async def test_a_sign_in_from_another_site_sets_no_cookie(start_client: StartClient) -> None:
    client = await start_client(admin_token=TOKEN, public_url="https://parley.shop.example")
    own = str(client.make_url("/")).rstrip("/")
    for headers in (
        {"Origin": "https://evil.example"},
        {"Origin": "https://parley.shop.example.evil.example"},
        {"Origin": "null"},
        {"Referer": "https://evil.example/page.html"},
    ):
        refused = await client.post(f"{ADMIN}/sign-in", json={"token": TOKEN}, headers=headers)
        assert refused.status == 403, headers
        assert (await refused.json())["error"]["code"] == "csrf_failed"
        assert "Set-Cookie" not in refused.headers
    # The gateway's own pages (its address, or its public URL), and scripts, which name none.
    for headers in (
        {"Origin": own},
        {"Origin": "https://parley.shop.example"},
        {"Referer": own + "/admin/sign-in"},
        {},
    ):
        accepted = await client.post(f"{ADMIN}/sign-in", json={"token": TOKEN}, headers=headers)
        assert accepted.status == 200, headers
        assert "parley_admin" in _set_cookie(accepted)


async def test_successful_sign_ins_do_not_use_up_the_limit(start_client: StartClient) -> None:
    client = await start_client(admin_token=TOKEN)
    for _ in range(15):
        await _sign_in(client, token=TOKEN)


async def test_secrets_never_reach_the_log(
    start_client: StartClient, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    client = await start_client(admin_token=TOKEN)
    await _staff(client).create("ann@shop.example", PASSWORD)
    session, csrf = await _sign_in(client, email="ann@shop.example", password=PASSWORD)
    await _sign_in(client, token=TOKEN)
    await client.post(f"{ADMIN}/sign-in", json={"token": TOKEN + "x"})
    await client.get(f"{ADMIN}/me", headers={"Authorization": f"Bearer {TOKEN}x"})
    await client.post(f"{ADMIN}/sign-out", headers={"Cookie": f"parley_admin={session}"})
    logged = "\n".join(r.getMessage() for r in caplog.records)
    assert "admin.sign_in" in logged  # the sign-ins are logged, without their secrets
    for secret in (TOKEN, PASSWORD, session, csrf):
        assert secret not in logged


async def test_parley_staff_create_reads_the_password_from_stdin(
    start_client: StartClient, database_url: str, tmp_path: Path
) -> None:
    import subprocess

    from tests.support.cli import PARLEY, clean_env

    env = clean_env(PARLEY_DATABASE_URL=database_url, PARLEY_DATA_DIR=str(tmp_path / "data"))
    created = subprocess.run(
        [PARLEY, "staff", "create", "Ann@Shop.example", "--name", "Ann"],
        input=PASSWORD + "\n",
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert created.returncode == 0, created.stderr
    assert created.stdout.strip() == "created staff account ann@shop.example (Ann), role admin"
    assert PASSWORD not in created.stdout + created.stderr
    short = run_parley("staff", "create", "bob@shop.example", cwd=tmp_path,
                       PARLEY_DATABASE_URL=database_url, PARLEY_STAFF_PASSWORD="short")  # fmt: skip
    assert short.returncode == 2
    assert "at least 10 characters" in short.stderr
    listed = run_parley("staff", "list", cwd=tmp_path, PARLEY_DATABASE_URL=database_url)
    assert listed.stdout.startswith("ann@shop.example\tAnn\tactive\tadmin")

    client = await start_client()
    await _sign_in(client, email="ann@shop.example", password=PASSWORD)
