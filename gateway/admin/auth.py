"""Who may use the staff console and the admin API: the admin token, or a staff session.

Two ways in, checked in this order:

- ``Authorization: Bearer <PARLEY_ADMIN_TOKEN>`` (scripts, the JSON API). No cookie, so no
  CSRF check.
- the session cookie a browser got from signing in (with the admin token or a staff
  email and password). A cookie is sent by the browser on its own, so every state-changing
  request made with it must also carry the session's CSRF token, in the ``X-CSRF-Token``
  header or the ``csrf_token`` form field (the synchronizer-token pattern).

The guard middleware (`gateway.admin.guard`) applies this to every ``/admin`` and
``/api/v1/admin`` route and leaves the signed-in `Staff` at ``request[STAFF]``; pages read
`current_staff(request)` and put `csrf_token(request)` into their forms.
"""

from __future__ import annotations

import hmac
import logging
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Literal

from aiohttp import web

from core.errors import AdminDisabled, Forbidden, RateLimited, Unauthorized
from core.ports import Cache
from core.settings import Settings
from core.store.staff import NewSession, StaffAccounts, StaffMember, StaffSessions

log = logging.getLogger(__name__)

SESSION_COOKIE = "parley_admin"
CSRF_HEADER = "X-CSRF-Token"
CSRF_FIELD = "csrf_token"
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
_FORMS = ("application/x-www-form-urlencoded", "multipart/form-data")

# Failed sign-ins, as token buckets (tokens a second, burst): per client address, and per
# account so that guessing one password from many addresses is slowed down too.
ADDRESS_LIMIT = (1 / 30, 10.0)
ACCOUNT_LIMIT = (1 / 60, 10.0)


class CsrfRejected(Forbidden):
    """A cookie-authenticated, state-changing request without its session's CSRF token."""

    code = "csrf_failed"


@dataclass(frozen=True, slots=True)
class Staff:
    """Who is making an admin request."""

    id: int | None  # the staff account; None when signed in with the admin token
    email: str | None
    name: str
    via: Literal["token", "session"]
    csrf_token: str | None = None  # sessions only: what forms and X-CSRF-Token must carry

    @property
    def label(self) -> str:
        """How staff actions are attributed: the account's address, or "admin"."""
        return self.email or "admin"

    @classmethod
    def of(
        cls, member: StaffMember | None, via: Literal["token", "session"], csrf: str | None
    ) -> Staff:
        if member is None:
            return cls(None, None, "Admin", via, csrf)
        return cls(member.id, member.email, member.display_name, via, csrf)


@dataclass(frozen=True, slots=True)
class SignedIn:
    """A successful sign-in: put ``session`` into the cookie with `StaffAuth.set_cookie`."""

    staff: Staff
    session: NewSession

    @property
    def csrf_token(self) -> str:
        return self.session.csrf_token

    @property
    def expires_at(self) -> datetime:
        return self.session.expires_at


STAFF = web.RequestKey("staff", Staff)


def current_staff(request: web.Request) -> Staff:
    """The signed-in staff member of a guarded request."""
    return request[STAFF]


def csrf_token(request: web.Request) -> str:
    """The token a console form must send back as the ``csrf_token`` field ("" for Bearer)."""
    staff = request.get(STAFF)
    return (staff.csrf_token or "") if staff is not None else ""


def _bearer(request: web.Request) -> str | None:
    header = request.headers.get("Authorization")
    if header is None:
        return None
    scheme, _, value = header.partition(" ")
    if scheme.lower() != "bearer" or not value.strip():
        raise Unauthorized("send the admin token as 'Authorization: Bearer <token>'")
    return value.strip()


def _same(given: str, expected: str) -> bool:
    return hmac.compare_digest(given.encode(), expected.encode())


class StaffAuth:
    """Signs staff in and out and recognises them on later requests."""

    def __init__(
        self,
        settings: Settings,
        accounts: StaffAccounts,
        sessions: StaffSessions,
        cache: Cache,
    ) -> None:
        token = settings.admin_token.get_secret_value() if settings.admin_token else ""
        self._token = token or None
        self._accounts = accounts
        self._sessions = sessions
        self._cache = cache
        self._lifetime = timedelta(hours=settings.admin_session_hours)
        # A cookie marked Secure is only sent over https; a plain-http gateway must not set it.
        self.secure_cookies = bool(settings.public_url and settings.public_url.startswith("https:"))

    async def enabled(self) -> bool:
        """Whether anyone at all can sign in."""
        return self._token is not None or await self._accounts.any_enabled()

    async def _unauthorized(self, message: str) -> Unauthorized:
        """The error for missing credentials, or `AdminDisabled` when none could exist."""
        if not await self.enabled():
            raise AdminDisabled(
                "the staff console is disabled: set PARLEY_ADMIN_TOKEN or create a staff "
                "account with `parley staff create EMAIL`"
            )
        return Unauthorized(message)

    async def _check_limit(self, key: str, limit: tuple[float, float]) -> None:
        rate, burst = limit
        # A zero-cost take reads the bucket without spending: only failures spend.
        bucket = await self._cache.take_token(key, rate=rate, capacity=burst, cost=0)
        if bucket.remaining < 1:
            raise RateLimited(
                "too many failed sign-ins; try again later", (1 - bucket.remaining) / rate
            )

    async def _failed(self, keys: list[tuple[str, tuple[float, float]]], why: str) -> None:
        for key, (rate, burst) in keys:
            await self._cache.take_token(key, rate=rate, capacity=burst)
        log.info("admin.sign_in.failed reason=%s", why)

    async def sign_in(
        self,
        *,
        remote: str,
        token: str | None = None,
        email: str | None = None,
        password: str | None = None,
    ) -> SignedIn:
        """A new session for the admin token, or for a staff email and password.

        Raises `Unauthorized` for wrong credentials and `RateLimited` after too many of them.
        """
        limits = [(f"admin:sign-in:address:{remote}", ADDRESS_LIMIT)]
        if email:
            limits.append((f"admin:sign-in:account:{email.strip().lower()}", ACCOUNT_LIMIT))
        for key, limit in limits:
            await self._check_limit(key, limit)
        if token is not None:
            if self._token is None:
                raise await self._unauthorized(
                    "no admin token is configured; sign in with a password"
                )
            if not _same(token, self._token):
                await self._failed(limits, "token")
                raise Unauthorized("wrong admin token")
            member = None
        elif email is not None and password is not None:
            found = await self._accounts.authenticate(email, password)
            if found is None:
                await self._failed(limits, "password")
                raise await self._unauthorized("wrong email address or password")
            member = found
        else:
            raise await self._unauthorized("give the admin token, or an email address and password")
        session = await self._sessions.create(
            member.id if member else None,
            self._lifetime,
            admin_token=None if member else self._token,
        )
        log.info("admin.sign_in via=%s staff=%s", "password" if member else "token",
                 member.id if member else "-")  # fmt: skip
        return SignedIn(Staff.of(member, "session", session.csrf_token), session)

    async def sign_out(self, request: web.Request) -> None:
        session_id = request.cookies.get(SESSION_COOKIE)
        if session_id:
            await self._sessions.delete(session_id)

    def set_cookie(self, response: web.StreamResponse, signed_in: SignedIn) -> None:
        response.set_cookie(
            SESSION_COOKIE,
            signed_in.session.session_id,
            max_age=int(self._lifetime.total_seconds()),
            path="/",
            httponly=True,
            secure=self.secure_cookies,
            samesite="Strict",
        )

    def clear_cookie(self, response: web.StreamResponse) -> None:
        response.del_cookie(
            SESSION_COOKIE, path="/", secure=self.secure_cookies, httponly=True, samesite="Strict"
        )

    async def authenticate(self, request: web.Request) -> Staff:
        """The staff member behind a request: its Bearer token, else its session cookie."""
        token = _bearer(request)
        if token is not None:
            if self._token is None:
                raise await self._unauthorized("no admin token is configured on this gateway")
            limit = [(f"admin:sign-in:address:{request.remote or 'unknown'}", ADDRESS_LIMIT)]
            await self._check_limit(*limit[0])
            if not _same(token, self._token):
                await self._failed(limit, "bearer")
                raise Unauthorized("wrong admin token")
            return Staff(None, None, "Admin", "token")
        session_id = request.cookies.get(SESSION_COOKIE)
        if session_id:
            found = await self._sessions.find(session_id, admin_token=self._token)
            if found is not None:
                return Staff.of(found.staff, "session", found.csrf_token)
            raise await self._unauthorized("your session has ended; sign in again")
        raise await self._unauthorized(
            "sign in, or send the admin token as 'Authorization: Bearer <token>'"
        )

    async def check_csrf(self, request: web.Request, staff: Staff) -> None:
        """Refuse a state-changing request a session makes without its CSRF token."""
        if staff.via != "session" or request.method in SAFE_METHODS:
            return
        given = request.headers.get(CSRF_HEADER)
        if given is None and request.content_type in _FORMS:
            field = (await request.post()).get(CSRF_FIELD)
            given = field if isinstance(field, str) else None
        if not given or staff.csrf_token is None or not _same(given, staff.csrf_token):
            log.info("admin.csrf.rejected path=%s", request.path)
            raise CsrfRejected(f"missing or wrong CSRF token (send it as {CSRF_HEADER})")
