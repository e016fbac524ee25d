"""A round-robin reverse proxy: what a load balancer in front of several gateways does.

Each request goes, as it came (method, path and query, headers, body), to the next gateway in
turn, and its answer comes back as the gateway gave it. The proxy counts what each gateway got.
"""

from __future__ import annotations

import itertools
from collections import Counter

import aiohttp
from aiohttp import web

# Headers of one connection, never passed on (RFC 9110, 7.6.1), and those aiohttp sets itself.
_HOP_BY_HOP = frozenset(
    {"connection", "keep-alive", "proxy-connection", "te", "trailer", "transfer-encoding",
     "upgrade", "content-length", "host"}
)  # fmt: skip


class RoundRobinProxy:
    def __init__(self, upstreams: list[str]) -> None:
        self.upstreams = upstreams
        self.served: Counter[str] = Counter()  # requests answered, by upstream
        self._next = itertools.cycle(upstreams)
        self._session: aiohttp.ClientSession | None = None
        self._runner: web.AppRunner | None = None

    async def start(self, host: str, port: int) -> None:
        self._session = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=30), auto_decompress=False
        )
        app = web.Application(client_max_size=2 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self._forward)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=1.0)
        await self._runner.setup()
        await web.TCPSite(self._runner, host, port, reuse_address=True).start()

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
        if self._session is not None:
            await self._session.close()

    async def _forward(self, request: web.Request) -> web.Response:
        assert self._session is not None
        upstream = next(self._next)
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP_BY_HOP}
        body = await request.read()
        async with self._session.request(
            request.method,
            upstream + request.raw_path,
            headers=headers,
            data=body or None,
            allow_redirects=False,
        ) as answer:
            content = await answer.read()
            passed = {k: v for k, v in answer.headers.items() if k.lower() not in _HOP_BY_HOP}
            self.served[upstream] += 1
            return web.Response(status=answer.status, body=content, headers=passed)
