"""Staff accounts (argon2id password hashes), their browser sessions (stored hashed) and the
device tokens that mark a browser an account has signed in with."""

from __future__ import annotations

import asyncio
import base64
import functools
import hashlib
import hmac
import re
import secrets
import time
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Literal

import asyncpg
from argon2 import PasswordHasher
from argon2.exceptions import InvalidHashError, VerificationError

from core.errors import Conflict, InvalidInput, NotFound
from core.store.database import Connection

Role = Literal["admin", "agent"]
# An admin may do everything; an agent works on conversations, gaps, curated answers, answer
# checks and the playground. Each role may do what the roles after it may.
ROLES: tuple[Role, ...] = ("admin", "agent")

MIN_PASSWORD_CHARS = 10
MAX_PASSWORD_CHARS = 1024
_EMAIL = re.compile(r"^[^@\s]+@[^@\s]+\.[^@\s]+$")

# argon2-cffi's defaults are RFC 9106's low-memory profile (argon2id, 64 MiB, t=3).
_HASHER = PasswordHasher()


@functools.cache
def _dummy_hash() -> str:
    """Unknown addresses are checked against this, so they take as long as known ones."""
    return _HASHER.hash(secrets.token_urlsafe(16))


def _verify(stored: str, password: str) -> bool:
    try:
        return _HASHER.verify(stored, password)
    except (VerificationError, InvalidHashError):
        return False


def normalise_email(email: str) -> str:
    email = email.strip().lower()
    if not _EMAIL.match(email) or len(email) > 254:
        raise InvalidInput(f"{email!r} is not an email address")
    return email


def check_password(password: str) -> str:
    if len(password) < MIN_PASSWORD_CHARS:
        raise InvalidInput(f"a password needs at least {MIN_PASSWORD_CHARS} characters")
    if len(password) > MAX_PASSWORD_CHARS:
        raise InvalidInput(f"a password may have at most {MAX_PASSWORD_CHARS} characters")
    return password


def check_role(role: str) -> Role:
    for known in ROLES:
        if role == known:
            return known
    raise InvalidInput(f"{role!r} is not a role: give one of {', '.join(ROLES)}")


def role_allows(role: Role, needed: Role) -> bool:
    """Whether an account with ``role`` may do what needs ``needed``."""
    return ROLES.index(role) <= ROLES.index(needed)


def hash_password(password: str) -> str:
    return _HASHER.hash(check_password(password))


def _session_hash(session_id: str) -> bytes:
    return hashlib.sha256(session_id.encode()).digest()


def _token_mac(token: str, session_id: str) -> bytes:
    return hmac.new(token.encode(), session_id.encode(), hashlib.sha256).digest()


# A device token: "<staff id>.<expires, Unix time>.<nonce>.<mac>".
_DEVICE = re.compile(r"([0-9]{1,18})\.([0-9]{1,12})\.([A-Za-z0-9_-]{22})\.([A-Za-z0-9_-]{43})")


def _device_mac(password_hash: str, staff_id: int, expires: int, nonce: str) -> str:
    # Keyed with the account's password hash: a secret only the database holds, so no key
    # needs configuring, and a new password voids every device token made before it.
    key = hashlib.sha256(b"parley-device\0" + password_hash.encode()).digest()
    mac = hmac.new(key, f"{staff_id}.{expires}.{nonce}".encode(), hashlib.sha256).digest()
    return base64.urlsafe_b64encode(mac).rstrip(b"=").decode()


@dataclass(frozen=True, slots=True)
class StaffMember:
    id: int
    email: str
    display_name: str
    role: Role
    disabled: bool
    last_sign_in_at: datetime | None
    created_at: datetime


@dataclass(frozen=True, slots=True)
class StaffSession:
    """A signed-in browser; ``staff`` is None when it signed in with the admin token."""

    staff: StaffMember | None
    csrf_token: str
    expires_at: datetime


@dataclass(frozen=True, slots=True)
class NewSession:
    """A session just made: ``session_id`` goes into the cookie and is never stored."""

    session_id: str
    csrf_token: str
    expires_at: datetime


_MEMBER = (
    "id, email, display_name, role, disabled_at IS NOT NULL AS disabled, last_sign_in_at, "
    "created_at"
)


def _member(row: asyncpg.Record) -> StaffMember:
    return StaffMember(
        row["id"],
        row["email"],
        row["display_name"],
        check_role(row["role"]),
        row["disabled"],
        row["last_sign_in_at"],
        row["created_at"],
    )


class StaffAccounts:
    def __init__(self, pool: asyncpg.Pool) -> None:
        self._pool = pool

    async def create(
        self, email: str, password: str, *, display_name: str = "", role: Role | None = None
    ) -> StaffMember:
        """A new account. Without a ``role`` it is an agent, unless no enabled admin account
        exists yet: the first account made is the one that can manage the others."""
        email = normalise_email(email)
        # Hashing takes tens of milliseconds of CPU on purpose: off the event loop.
        password_hash = await asyncio.to_thread(hash_password, password)
        try:
            row = await self._pool.fetchrow(
                f"""INSERT INTO staff (email, display_name, password_hash, role)
                    VALUES ($1, $2, $3, COALESCE($4, CASE WHEN EXISTS (
                        SELECT 1 FROM staff WHERE role = 'admin' AND disabled_at IS NULL)
                        THEN 'agent' ELSE 'admin' END))
                    RETURNING {_MEMBER}""",
                email,
                display_name.strip() or email.split("@")[0],
                password_hash,
                check_role(role) if role is not None else None,
            )
        except asyncpg.UniqueViolationError:
            raise Conflict(f"a staff account for {email} exists already") from None
        assert row is not None
        return _member(row)

    async def set_password(self, email: str, password: str) -> None:
        """A new password; the account's open sessions end, wherever they are."""
        password_hash = await asyncio.to_thread(hash_password, password)
        async with self._pool.acquire() as conn, conn.transaction():
            staff_id = await conn.fetchval(
                "UPDATE staff SET password_hash = $2 WHERE email = $1 RETURNING id",
                normalise_email(email),
                password_hash,
            )
            if staff_id is None:
                raise NotFound(f"no staff account for {email}")
            await conn.execute("DELETE FROM staff_sessions WHERE staff_id = $1", staff_id)

    async def set_disabled(self, account: int | str, disabled: bool) -> StaffMember:
        """A disabled account cannot sign in, and its open sessions end: enabling it again
        does not bring them back. The last enabled admin cannot be disabled (`Conflict`).

        ``account`` is the account's id or email address."""
        async with self._pool.acquire() as conn, conn.transaction():
            staff_id = await _locked(conn, account)
            if disabled:
                await _keep_an_admin(conn, staff_id, "disable")
            row = await conn.fetchrow(
                f"""UPDATE staff SET disabled_at = CASE WHEN $2 THEN now() ELSE NULL END
                    WHERE id = $1 RETURNING {_MEMBER}""",
                staff_id,
                disabled,
            )
            if disabled:
                await conn.execute("DELETE FROM staff_sessions WHERE staff_id = $1", staff_id)
        assert row is not None
        return _member(row)

    async def set_role(self, account: int | str, role: Role) -> StaffMember:
        """Give an account (its id or email address) another role; takes effect on its next
        request. The last enabled admin cannot become an agent (`Conflict`)."""
        role = check_role(role)
        async with self._pool.acquire() as conn, conn.transaction():
            staff_id = await _locked(conn, account)
            if role != "admin":
                await _keep_an_admin(conn, staff_id, "make an agent")
            row = await conn.fetchrow(
                f"UPDATE staff SET role = $2 WHERE id = $1 RETURNING {_MEMBER}", staff_id, role
            )
        assert row is not None
        return _member(row)

    async def get(self, staff_id: int) -> StaffMember:
        row = await self._pool.fetchrow(f"SELECT {_MEMBER} FROM staff WHERE id = $1", staff_id)
        if row is None:
            raise NotFound(f"no staff account with the id {staff_id}")
        return _member(row)

    async def authenticate(self, email: str, password: str) -> StaffMember | None:
        """The enabled account with this address and password, else None.

        The hash is checked even for unknown addresses, so timing does not tell which exist.
        """
        try:
            email = normalise_email(email)
        except InvalidInput:
            email = ""
        row = await self._pool.fetchrow(
            f"SELECT {_MEMBER}, password_hash FROM staff WHERE email = $1", email
        )
        stored = row["password_hash"] if row is not None else await asyncio.to_thread(_dummy_hash)
        if not await asyncio.to_thread(_verify, stored, password):
            return None
        if row is None or row["disabled"]:
            return None
        if _HASHER.check_needs_rehash(stored):
            await self._pool.execute(
                "UPDATE staff SET password_hash = $2 WHERE id = $1",
                row["id"],
                await asyncio.to_thread(_HASHER.hash, password),
            )
        await self._pool.execute(
            "UPDATE staff SET last_sign_in_at = now() WHERE id = $1", row["id"]
        )
        return _member(row)

    async def device_token(self, staff_id: int, lifetime: timedelta) -> str:
        """A token for the browser that has just signed in to the account ``staff_id``: it
        says "this browser signed in here before" until ``lifetime`` is over or the password
        changes. Not a credential: it only lets `device_owner` tell the owner's browser
        apart from a guesser's (`gateway.admin.throttle`)."""
        stored = await self._pool.fetchval(
            "SELECT password_hash FROM staff WHERE id = $1", staff_id
        )
        if stored is None:
            raise NotFound(f"no staff account with the id {staff_id}")
        expires = int(time.time() + lifetime.total_seconds())
        nonce = secrets.token_urlsafe(16)
        return f"{staff_id}.{expires}.{nonce}.{_device_mac(stored, staff_id, expires, nonce)}"

    async def device_owner(self, token: str) -> tuple[str, str] | None:
        """(the email address of the enabled account ``token`` was made for, the token's
        nonce), while the token is unexpired and the password unchanged; else None."""
        parts = _DEVICE.fullmatch(token)
        if parts is None or int(parts[2]) <= time.time():
            return None
        staff_id, expires, nonce, mac = int(parts[1]), int(parts[2]), parts[3], parts[4]
        row = await self._pool.fetchrow(
            """SELECT email, password_hash FROM staff
                WHERE id = $1 AND disabled_at IS NULL""",
            staff_id,
        )
        if row is None:
            return None
        expected = _device_mac(row["password_hash"], staff_id, expires, nonce)
        if not hmac.compare_digest(mac.encode(), expected.encode()):
            return None
        return str(row["email"]), nonce

    async def list(self) -> list[StaffMember]:
        rows = await self._pool.fetch(f"SELECT {_MEMBER} FROM staff ORDER BY email")
        return [_member(r) for r in rows]

    async def any_enabled(self) -> bool:
        found: bool = await self._pool.fetchval(
            "SELECT EXISTS (SELECT 1 FROM staff WHERE disabled_at IS NULL)"
        )
        return found


async def _locked(conn: Connection, account: int | str) -> int:
    """The id of an account, by id or email address. The enabled admins are locked first,
    always in the same order, so two changes that could each leave no admin take turns."""
    await conn.execute(
        "SELECT id FROM staff WHERE role = 'admin' AND disabled_at IS NULL ORDER BY id FOR UPDATE"
    )
    if isinstance(account, int):
        staff_id = await conn.fetchval("SELECT id FROM staff WHERE id = $1 FOR UPDATE", account)
        missing = f"no staff account with the id {account}"
    else:
        staff_id = await conn.fetchval(
            "SELECT id FROM staff WHERE email = $1 FOR UPDATE", normalise_email(account)
        )
        missing = f"no staff account for {account.strip().lower()}"
    if staff_id is None:
        raise NotFound(missing)
    return int(staff_id)


async def _keep_an_admin(conn: Connection, staff_id: int, change: str) -> None:
    """Refuse a change that would leave no enabled admin account: nobody could then manage
    the accounts from the console or the API."""
    admins = await conn.fetch(
        "SELECT id, email FROM staff WHERE role = 'admin' AND disabled_at IS NULL"
    )
    if [r["id"] for r in admins] == [staff_id]:
        raise Conflict(
            f"cannot {change} {admins[0]['email']}: it is the last admin account; "
            "make another account an admin first"
        )


class StaffSessions:
    def __init__(self, pool: asyncpg.Pool) -> None:
        self._pool = pool

    async def create(
        self, staff_id: int | None, lifetime: timedelta, *, admin_token: str | None = None
    ) -> NewSession:
        """A session for a staff account, or (``staff_id`` None) for the admin token."""
        if (staff_id is None) != (admin_token is not None):
            raise ValueError("a session is for a staff account or for the admin token")
        session_id = secrets.token_urlsafe(32)
        csrf_token = secrets.token_urlsafe(32)
        # Expired sessions are cleared as new ones are made; nothing else needs to run.
        await self._pool.execute("DELETE FROM staff_sessions WHERE expires_at < now()")
        expires_at: datetime = await self._pool.fetchval(
            """INSERT INTO staff_sessions (token_hash, staff_id, token_mac, csrf_token, expires_at)
               VALUES ($1, $2, $3, $4, now() + $5) RETURNING expires_at""",
            _session_hash(session_id),
            staff_id,
            _token_mac(admin_token, session_id) if admin_token is not None else None,
            csrf_token,
            lifetime,
        )
        return NewSession(session_id, csrf_token, expires_at)

    async def find(self, session_id: str, *, admin_token: str | None) -> StaffSession | None:
        """The live session with this id: not expired, its account (if any) not disabled, and
        a token session only while ``admin_token`` is still the one it was made with."""
        row = await self._pool.fetchrow(
            """SELECT ss.csrf_token, ss.expires_at, ss.staff_id, ss.token_mac, s.id, s.email,
                      s.display_name, s.role, s.disabled_at IS NOT NULL AS disabled,
                      s.last_sign_in_at, s.created_at
                 FROM staff_sessions ss LEFT JOIN staff s ON s.id = ss.staff_id
                WHERE ss.token_hash = $1 AND ss.expires_at > now()""",
            _session_hash(session_id),
        )
        if row is None:
            return None
        if row["staff_id"] is None:
            if admin_token is None or not hmac.compare_digest(
                bytes(row["token_mac"]), _token_mac(admin_token, session_id)
            ):
                return None
            return StaffSession(None, row["csrf_token"], row["expires_at"])
        if row["disabled"]:
            return None
        return StaffSession(_member(row), row["csrf_token"], row["expires_at"])

    async def delete(self, session_id: str) -> None:
        await self._pool.execute(
            "DELETE FROM staff_sessions WHERE token_hash = $1", _session_hash(session_id)
        )
