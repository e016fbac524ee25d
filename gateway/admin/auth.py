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

Wrong credentials are slowed down by `gateway.admin.throttle`; right ones never are, so
someone else's guessing cannot keep staff out: a right admin token is never counted, and a
password from a browser that signed in to that account before (``DEVICE_COOKIE``) is
counted for that browser alone, whatever others fail at from its address.

A sign-in that sets the cookie must come as JSON from a page of this gateway (or from no
page at all: a script), so that another site cannot sign a visitor's browser in to an
account of its choosing (login CSRF).
"""

from __future__ import annotations

import hmac
import logging
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Literal
from urllib.parse import urlsplit

from aiohttp import web

from core.errors import AdminDisabled, Forbidden, Unauthorized
from core.ports import Cache
from core.settings import Settings
from core.store.staff import (
    NewSession,
    Role,
    StaffAccounts,
    StaffMember,
    StaffSessions,
    role_allows,
)
from gateway.admin.throttle import SignInThrottle
from gateway.client_address import client_address

log = logging.getLogger(__name__)

SESSION_COOKIE = "parley_admin"
# Marks a browser that signed in to a staff account with its password (`_device`).
DEVICE_COOKIE = "parley_device"
DEVICE_LIFETIME = timedelta(days=90)
CSRF_HEADER = "X-CSRF-Token"
CSRF_FIELD = "csrf_token"
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
_FORMS = ("application/x-www-form-urlencoded", "multipart/form-data")
# What the admin token is, to the throttle: an account no email address can be.
TOKEN_ACCOUNT = "token"  # noqa: S105 (a name, not a secret)


class CsrfRejected(Forbidden):
    """A cookie-authenticated, state-changing request without its session's CSRF token."""

    code = "csrf_failed"


class RoleRequired(Forbidden):
    """Signed in, but with a role that may not do this (an agent, at an admin's work)."""

    code = "role_required"


@dataclass(frozen=True, slots=True)
class Staff:
    """Who is making an admin request, and with which role (the admin token is an admin)."""

    id: int | None  # the staff account; None when signed in with the admin token
    email: str | None
    name: str
    via: Literal["token", "session"]
    role: Role = "admin"
    csrf_token: str | None = None  # sessions only: what forms and X-CSRF-Token must carry

    @property
    def label(self) -> str:
        """How staff actions are attributed: the account's address, or "admin"."""
        return self.email or "admin"

    def may(self, needed: Role) -> bool:
        """Whether this staff member's role allows what needs the role ``needed``."""
        return role_allows(self.role, needed)

    def require(self, needed: Role, what: str) -> None:
        """Raise `RoleRequired` unless this staff member may do ``what``, which needs
        the role ``needed``."""
        if not self.may(needed):
            log.info("admin.role.refused staff=%s needed=%s", self.id, needed)
            raise RoleRequired(f"{what} needs the {needed} role; you are signed in as {self.role}")

    @classmethod
    def of(
        cls, member: StaffMember | None, via: Literal["token", "session"], csrf: str | None
    ) -> Staff:
        if member is None:
            return cls(None, None, "Admin", via, "admin", csrf)
        return cls(member.id, member.email, member.display_name, via, member.role, csrf)


@dataclass(frozen=True, slots=True)
class SignedIn:
    """A successful sign-in: put ``session`` into the cookie with `StaffAuth.set_cookie`."""

    staff: Staff
    session: NewSession
    device: str | None = None  # a new device token for the browser (password sign-ins)

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


def _host(url: str | None) -> str | None:
    """The ``host[:port]`` of an absolute URL, lowercased; None for anything else ("null")."""
    if not url:
        return None
    try:
        parts = urlsplit(url)
    except ValueError:
        return None
    return parts.netloc.lower() if parts.scheme in ("http", "https") and parts.netloc else None


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
        self._throttle = SignInThrottle(cache)
        self._lifetime = timedelta(hours=settings.admin_session_hours)
        self._public_host = _host(settings.public_url)
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

    async def _wrong_token(self, address: str, why: str) -> Unauthorized:
        """A wrong admin token: counted, and `RateLimited` raised once they come too fast."""
        await self._throttle.begin(TOKEN_ACCOUNT, address)
        log.info("admin.sign_in.failed reason=%s address=%s", why, address)
        return Unauthorized("wrong admin token")

    def check_sign_in_request(self, request: web.Request) -> None:
        """Refuse a cookie-setting sign-in that another site's page could have sent.

        Its body must be declared JSON (415 otherwise): a page elsewhere can only send that
        after a CORS preflight, which this gateway never grants. And a browser says which page
        sent it, in ``Origin`` (or, failing that, ``Referer``): it must be one of this
        gateway's (403 otherwise). A request naming no page at all comes from a script.
        """
        if request.content_type != "application/json":
            raise web.HTTPUnsupportedMediaType(
                reason="send the sign-in as JSON (Content-Type: application/json)"
            )
        sender = request.headers.get("Origin", request.headers.get("Referer"))
        if sender is None:
            return
        if _host(sender) not in {request.host.lower(), self._public_host} - {None}:
            log.info("admin.sign_in.refused reason=origin")
            raise CsrfRejected("sign-in is only accepted from this gateway's own pages")

    async def sign_in(
        self,
        *,
        address: str,
        token: str | None = None,
        email: str | None = None,
        password: str | None = None,
        device: str | None = None,
    ) -> SignedIn:
        """A new session for the admin token, or for a staff email and password, signing in
        from the client ``address``; ``device`` is the browser's device cookie, if any.

        Raises `Unauthorized` for wrong credentials and `RateLimited` when they come too fast.
        """
        if token is not None:
            if self._token is None:
                raise await self._unauthorized(
                    "no admin token is configured; sign in with a password"
                )
            if not _same(token, self._token):
                raise await self._wrong_token(address, "token")
            member = None
        elif email is not None and password is not None:
            account = email.strip().lower()
            known = await self._device(device, account)
            attempt = await self._throttle.begin(account, address, known)
            found = await self._accounts.authenticate(email, password)
            if found is None:
                log.info("admin.sign_in.failed reason=password address=%s", address)
                raise await self._unauthorized("wrong email address or password")
            await self._throttle.succeeded(attempt)
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
        new_device = (
            await self._accounts.device_token(member.id, DEVICE_LIFETIME) if member else None
        )
        return SignedIn(Staff.of(member, "session", session.csrf_token), session, new_device)

    async def _device(self, cookie: str | None, account: str) -> str | None:
        """The nonce of the browser's device token when it was made for ``account`` (and is
        still good), else None: then the try counts against the address like anyone's."""
        if not cookie:
            return None
        owner = await self._accounts.device_owner(cookie)
        if owner is None or owner[0] != account:
            return None
        return owner[1]

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
        if signed_in.device is not None:
            # Kept after signing out: it marks the browser, not a session.
            response.set_cookie(
                DEVICE_COOKIE,
                signed_in.device,
                max_age=int(DEVICE_LIFETIME.total_seconds()),
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
            if not _same(token, self._token):
                raise await self._wrong_token(client_address(request), "bearer")
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

    async def still_allowed(self, request: web.Request, needed: Role) -> bool:
        """Whether the credentials ``request`` came with still sign in someone whose role
        allows ``needed``. The guard checks them when a request begins; a long-lived one
        (an event stream, a long poll) asks this again every few seconds
        (`gateway.admin.guard.while_allowed`), so that signing out, an account disabled or
        given a new password or another role, or a session expiring ends it too."""
        try:
            token = _bearer(request)
        except Unauthorized:
            return False
        if token is not None:
            return self._token is not None and _same(token, self._token)
        session_id = request.cookies.get(SESSION_COOKIE)
        if not session_id:
            return False
        found = await self._sessions.find(session_id, admin_token=self._token)
        if found is None:
            return False
        return role_allows(found.staff.role if found.staff else "admin", needed)

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
