"""A local file host like a provider's media URLs: files, redirects, credentials, slow bodies."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from aiohttp import web


@dataclass(frozen=True)
class MediaFile:
    """A file and how it is sent.

    By default at once, with its true Content-Length. ``streamed`` sends it without a
    Content-Length in ``chunk``-byte pieces ``delay`` seconds apart (after ``headers_delay``
    before the headers); ``endless`` sends the data again and again until the client goes;
    ``length`` declares that Content-Length whatever is sent, and when it promises more than
    ``data`` the host waits after the data until the client gives up.
    """

    data: bytes
    content_type: str = "audio/ogg"
    streamed: bool = False
    chunk: int = 16 * 1024
    delay: float = 0.0
    headers_delay: float = 0.0
    endless: bool = False
    length: int | None = None


@dataclass(frozen=True)
class Seen:
    path: str
    authorization: str | None
    accept_encoding: str | None


@dataclass
class FakeMediaHost:
    """Answers ``GET <path>`` with ``files[path]``, ``redirects[path]`` (302 to that
    Location), or ``statuses[path]``; 404 otherwise. With ``authorization`` set, a request
    without exactly that Authorization header is answered 401 (as Twilio's media URLs do
    without Basic auth). ``requests`` records every request; ``bytes_sent`` counts the body
    bytes written."""

    files: dict[str, MediaFile] = field(default_factory=dict)
    redirects: dict[str, str] = field(default_factory=dict)
    statuses: dict[str, int] = field(default_factory=dict)
    authorization: str | None = None
    requests: list[Seen] = field(default_factory=list)
    bytes_sent: int = 0

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/{path:.*}", self._get)
        return app

    def paths(self) -> list[str]:
        return [seen.path for seen in self.requests]

    async def _get(self, request: web.Request) -> web.StreamResponse:
        self.requests.append(
            Seen(
                request.path_qs,
                request.headers.get("Authorization"),
                request.headers.get("Accept-Encoding"),
            )
        )
        if self.authorization is not None and (
            request.headers.get("Authorization") != self.authorization
        ):
            return web.Response(status=401, headers={"WWW-Authenticate": 'Basic realm="media"'})
        if request.path in self.redirects:
            return web.Response(status=302, headers={"Location": self.redirects[request.path]})
        if request.path in self.statuses:
            return web.Response(status=self.statuses[request.path])
        file = self.files.get(request.path)
        if file is None:
            return web.Response(status=404)
        await asyncio.sleep(file.headers_delay)
        if not (file.streamed or file.endless or file.length is not None):
            self.bytes_sent += len(file.data)
            return web.Response(body=file.data, headers={"Content-Type": file.content_type})
        return await self._stream(request, file)

    async def _stream(self, request: web.Request, file: MediaFile) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": file.content_type})
        if file.length is not None:
            response.content_length = file.length
        await response.prepare(request)
        try:
            while True:
                for start in range(0, len(file.data), file.chunk):
                    piece = file.data[start : start + file.chunk]
                    await response.write(piece)
                    self.bytes_sent += len(piece)
                    await asyncio.sleep(file.delay)
                if not file.endless:
                    break
            if file.length is not None and file.length > len(file.data):
                await asyncio.Event().wait()  # promised more: wait until the client gives up
            await response.write_eof()
        except ConnectionResetError:
            pass  # the client went away, as it should when it has read enough
        return response
