"""Downloading one inbound media file (a voice note, a photo) from a provider, bounded.

Every download goes out through the crawler's guard (`core.knowledge.outbound`): the address
connected to, for the first request and each redirect, must be public or on
``PARLEY_MEDIA_ALLOW_NETWORKS``. A media URL arrives with a message, so it may point anywhere.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Collection, Mapping
from dataclasses import dataclass

import aiohttp
from yarl import URL

from core.errors import MediaUnavailable
from core.knowledge.outbound import PrivateAddressRefused, crawler_session, is_guarded
from core.settings import Settings

log = logging.getLogger(__name__)

MAX_REDIRECTS = 3
_REDIRECT_STATUSES = frozenset({301, 302, 303, 307, 308})
# Answers the same download may not get later: a timeout, "too early", a rate limit.
_RETRYABLE_STATUSES = frozenset({408, 425, 429})
_CHUNK_BYTES = 64 * 1024
# What a media file may be said to be. A page or data (HTML, JSON, text) is not read: it is
# what an internal service answers, never a voice note or a photo. octet-stream is what a
# store says when it was not told.
_MEDIA_MAJOR_TYPES = frozenset({"audio", "image", "video"})
_MEDIA_TYPES = frozenset({"application/ogg", "application/octet-stream"})


@dataclass(frozen=True, slots=True)
class FetchedMedia:
    """A downloaded file."""

    data: bytes
    content_type: str  # without parameters ("audio/ogg"); application/octet-stream if unsaid
    url: str  # where it was read in the end, after any redirects


def _origin(url: URL) -> tuple[str, str | None, int | None]:
    return (url.scheme, url.host, url.port)


def _fetchable(url: URL) -> bool:
    return url.scheme in ("http", "https") and bool(url.host)


def _is_media(content_type: str) -> bool:
    kind = content_type.lower()
    return kind.split("/", 1)[0] in _MEDIA_MAJOR_TYPES or kind in _MEDIA_TYPES


def media_session(settings: Settings) -> aiohttp.ClientSession:
    """The session media is downloaded with: the crawler's guarded one, its allow-list
    ``PARLEY_MEDIA_ALLOW_NETWORKS`` (not the crawler's: a crawled intranet is no media host)."""
    return crawler_session(settings.media_allow_networks)


def require_guarded(http: aiohttp.ClientSession) -> None:
    """Refuse a session that did not come from `media_session` (or `crawler_session`)."""
    if not is_guarded(http):
        raise TypeError("media is fetched only with a session from outbound.crawler_session()")


def is_refused(exc: aiohttp.ClientError) -> bool:
    """Whether a failed request is the guard refusing a private address."""
    return isinstance(exc, aiohttp.ClientConnectorError) and isinstance(
        exc.os_error, PrivateAddressRefused
    )


def _without_authorization(headers: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in headers.items() if k.lower() != "authorization"}


def _failed(reason: str, url: URL, *, transient: bool = False) -> MediaUnavailable:
    # The host only: the path and query of a media URL may carry a signature.
    log.warning("media.fetch.failed host=%s reason=%s transient=%s", url.host, reason, transient)
    return MediaUnavailable(reason, transient=transient)


def _credentials(
    headers: Mapping[str, str] | None, auth: tuple[str, str] | aiohttp.BasicAuth | None
) -> dict[str, str]:
    sent = {"Accept-Encoding": "identity", **(headers or {})}
    if auth is not None:
        if any(name.lower() == "authorization" for name in sent):
            raise ValueError("give auth or an Authorization header, not both")
        # As a header, since aiohttp 3.14 deprecates its `auth` parameter (and BasicAuth).
        if isinstance(auth, aiohttp.BasicAuth):
            sent["Authorization"] = auth.encode()
        else:
            sent["Authorization"] = aiohttp.encode_basic_auth(*auth)
    return sent


def _redirect_target(current: URL, response: aiohttp.ClientResponse) -> URL:
    location = response.headers.get("Location")
    if not location:
        raise _failed("redirect", current)
    try:
        target = current.join(URL(location))
    except ValueError:
        raise _failed("redirect", current) from None
    # A downgrade would let anyone on the path read (or replace) the file.
    if not _fetchable(target) or (current.scheme == "https" and target.scheme != "https"):
        raise _failed("redirect", current)
    return target


async def _read(response: aiohttp.ClientResponse, max_bytes: int) -> bytes:
    if response.content_length is not None and response.content_length > max_bytes:
        raise _failed("too_large", response.url)
    data = bytearray()
    async for chunk in response.content.iter_chunked(_CHUNK_BYTES):
        data += chunk
        if len(data) > max_bytes:
            raise _failed("too_large", response.url)
    return bytes(data)


async def fetch_media(
    http: aiohttp.ClientSession,
    url: str,
    *,
    headers: Mapping[str, str] | None = None,
    auth: tuple[str, str] | aiohttp.BasicAuth | None = None,
    provider: Collection[str] = (),
    max_bytes: int,
    timeout: float,  # noqa: ASYNC109 - a deadline for all hops, passed to aiohttp per hop
) -> FetchedMedia:
    """Download ``url`` into memory, or raise `core.errors.MediaUnavailable` (its ``reason``
    and ``transient`` say why, and whether trying again later may work).

    ``http`` must come from `media_session` (a `TypeError` otherwise): an address that is
    not public and not on its allow-list is ``refused``, checked on the address connected to
    for the first request and every redirect. At most ``max_bytes`` are read (a larger
    Content-Length is refused before the body), and the whole download, redirects included,
    takes at most ``timeout`` seconds. Up to `MAX_REDIRECTS` redirects are followed, never
    from https down to http. A body said to be a page or data (HTML, JSON, text) is not read
    (``not_media``).

    The credentials, Basic ``auth`` (``(login, password)``; `aiohttp.BasicAuth`, deprecated
    by aiohttp 3.14, is taken too) or an Authorization header in ``headers`` (a Bearer
    token), go only to the origin (scheme, host and port) of ``url``, and only when that is
    the origin of one of the ``provider``'s base URLs; otherwise they are sent to no one.
    After a redirect elsewhere (Twilio's media URL redirects to a short-lived signed URL on
    another host) they are sent to no one either, not even back there. ``http`` must carry
    no credentials of its own, since those would go to every hop.
    """
    require_guarded(http)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    current = URL(url)
    if not _fetchable(current):
        raise _failed("url", current)
    first_origin = _origin(current)
    # Media is already compressed; asking for none keeps Content-Length the true size.
    sent_headers = _credentials(headers, auth)
    carries = any(name.lower() == "authorization" for name in sent_headers)
    if carries and not provider:
        raise ValueError("credentials need the provider's base URLs they may go to")
    if carries and first_origin not in {_origin(URL(base)) for base in provider}:
        # A media URL that is not the provider's own gets the file, if any, without them.
        log.info("media.credentials.withheld host=%s", current.host)
        sent_headers = _without_authorization(sent_headers)
    for redirects in range(MAX_REDIRECTS + 1):
        remaining = deadline - loop.time()
        if remaining <= 0:
            raise _failed("timeout", current, transient=True)
        try:
            async with http.get(
                current,
                headers=sent_headers,
                allow_redirects=False,
                raise_for_status=False,
                # `total` covers connecting, the headers and reading the body.
                timeout=aiohttp.ClientTimeout(total=remaining),
            ) as response:
                if response.status in _REDIRECT_STATUSES:
                    target = _redirect_target(current, response)
                elif 200 <= response.status < 300:
                    if not _is_media(response.content_type):
                        raise _failed("not_media", current)
                    data = await _read(response, max_bytes)
                    log.debug(
                        "media.fetched host=%s bytes=%d type=%s redirects=%d",
                        response.url.host,
                        len(data),
                        response.content_type,
                        redirects,
                    )
                    return FetchedMedia(data, response.content_type, str(response.url))
                else:
                    status = response.status
                    transient = status >= 500 or status in _RETRYABLE_STATUSES
                    raise _failed(f"http_{status}", current, transient=transient)
        except TimeoutError as exc:  # aiohttp's own timeout errors are TimeoutErrors too
            raise _failed("timeout", current, transient=True) from exc
        except aiohttp.ClientError as exc:
            if is_refused(exc):
                # Never transient: the same address will be refused again.
                raise _failed("refused", current) from exc
            raise _failed("connection", current, transient=True) from exc
        if _origin(target) != first_origin:
            sent_headers = _without_authorization(sent_headers)
        current = target
    raise _failed("redirect", current)
