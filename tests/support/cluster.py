"""Several gateways and several workers on one database and one Redis, as deployments scale out.

`Cluster` is a fault rig (`tests.support.faults.Rig`: the fakes, the load generator, the
tallies per customer) with ``gateways`` `parley serve --no-workers` processes behind a
round-robin proxy (`tests.support.proxy`), the one address the providers call and the one
their signatures cover (``PARLEY_PUBLIC_URL``), and ``workers`` `parley worker` processes.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from tests.support.faults import HOST, Process, Rig
from tests.support.proxy import RoundRobinProxy
from tests.support.services import RedisServer, free_port


class Cluster(Rig):
    def __init__(
        self,
        workdir: Path,
        database_url: str,
        redis: RedisServer,
        env: Mapping[str, str] | None = None,
        *,
        gateways: int = 2,
        workers: int = 2,
    ) -> None:
        super().__init__(workdir, database_url, redis, env)
        # The proxy listens where a single gateway would: `url` (and `port`) are the proxy's.
        self.gateway_ports = [free_port() for _ in range(gateways)]
        self.gateways: list[Process] = []
        self.workers: list[Process] = []
        self.worker_count = workers
        self.proxy = RoundRobinProxy([f"http://{HOST}:{port}" for port in self.gateway_ports])

    async def _launch(self) -> None:
        for number, port in enumerate(self.gateway_ports, 1):
            env = self.env | {"PARLEY_PORT": str(port)}
            self.gateways.append(
                Process(f"serve-{number}", ["serve", "--no-workers"], env, self.workdir)
            )
        for number in range(1, self.worker_count + 1):
            self.workers.append(Process(f"worker-{number}", ["worker"], self.env, self.workdir))
        for gateway, port in zip(self.gateways, self.gateway_ports, strict=True):
            await self._ready(gateway, f"http://{HOST}:{port}/readyz")
        for worker in self.workers:
            await self._started(worker)
        await self.proxy.start(HOST, self.port)

    async def outbox_attempts(self) -> set[int]:
        """The numbers of attempts the replies took (a claim is an attempt)."""
        assert self._pool is not None
        return {r["attempts"] for r in await self._pool.fetch("SELECT attempts FROM outbox")}

    async def _close(self) -> None:
        await self.proxy.close()
        await super()._close()

    def close(self) -> None:
        for process in [*self.workers, *self.gateways]:
            process.stop()
        super().close()

    async def diagnose(self) -> str:
        lines = [await super().diagnose()]
        for process in [*self.gateways, *self.workers]:
            state = "running" if process.alive() else f"exited {process.popen.returncode}"
            lines.append(f"{process.name} ({state}):\n{process.tail()}")
        return "\n".join(lines)
