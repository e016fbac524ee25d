"""Widget turns under load: time to the first SSE event and the gateway-added time to first token.

    .venv/bin/python -m bench.turn                   # 1, 10 and 50 concurrent streams
    .venv/bin/python -m bench.turn --ttft 0.3 --rate 40 --rounds 5

A fake OpenAI-compatible LLM (fixed time to first token, fixed token rate) runs in this
process; `parley serve --demo` runs as a separate process on the embedded defaults with the
LLM pointed at the fake. The baseline is the same client streaming straight from the fake LLM,
in the same run: "added" is the gateway's first token minus the baseline's, per percentile.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
from aiohttp import web
from httpx_sse import aconnect_sse

from tests.fakes.openai import FakeOpenAI

QUESTIONS = [
    "How long does delivery to Belgium take?",
    "Hoe lang duurt de levering naar Duitsland?",
    "Welche Zahlungsmethoden gibt es?",
    "Can I return shoes I have worn outside?",
    "Wat kost verzending naar België?",
    "Is the Stormvang jacket waterproof?",
    "Bis wann muss ich bestellen, damit es heute verschickt wird?",
    "Where is your store in Rotterdam?",
]
REPLY = " ".join(["Parcels to Belgium arrive within one to two working days [1]."] * 4)


def _pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


async def _gateway_turn(
    client: httpx.AsyncClient, key: str, session: str, question: str
) -> tuple[float, float]:
    """(ms to the first event, ms to the first token) of one widget turn."""
    started = time.perf_counter()
    first_event = first_token = None
    body = {"message": question, "session_id": session}
    async with aconnect_sse(
        client, "POST", "/api/v1/agents/demo/chat", json=body, headers={"X-Parley-Key": key}
    ) as source:
        source.response.raise_for_status()
        async for event in source.aiter_sse():
            now = (time.perf_counter() - started) * 1000
            first_event = first_event if first_event is not None else now
            if event.event == "token" and first_token is None:
                first_token = now
            if event.event in ("done", "error"):
                if event.event == "error":
                    raise RuntimeError(f"turn failed: {event.data}")
                break
    assert first_event is not None
    assert first_token is not None
    return first_event, first_token


async def _baseline_turn(client: httpx.AsyncClient) -> float:
    """ms to the first token streaming straight from the fake LLM."""
    started = time.perf_counter()
    body = {"model": "bench", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
    async with client.stream("POST", "/v1/chat/completions", json=body) as response:
        async for line in response.aiter_lines():
            if line.startswith("data: ") and '"content"' in line and '"content": ""' not in line:
                return (time.perf_counter() - started) * 1000
    raise RuntimeError("no token from the fake LLM")


async def _level(
    base: str, llm: str, key: str, streams: int, rounds: int
) -> dict[str, list[float]]:
    limits = httpx.Limits(max_connections=streams + 5, max_keepalive_connections=streams + 5)
    results: dict[str, list[float]] = {"event": [], "token": [], "baseline": []}
    async with (
        httpx.AsyncClient(base_url=base, timeout=60, limits=limits) as gateway,
        httpx.AsyncClient(base_url=llm, timeout=60, limits=limits) as direct,
    ):

        async def visitor(number: int) -> None:
            for turn in range(rounds):
                question = QUESTIONS[(number + turn) % len(QUESTIONS)]
                # A new visitor each turn: a follow-up would add the rewrite model's own latency.
                session = f"bench-{streams}-{number:03d}-{turn:03d}"
                event, token = await _gateway_turn(gateway, key, session, question)
                results["event"].append(event)
                results["token"].append(token)
                results["baseline"].append(await _baseline_turn(direct))

        await asyncio.gather(*(visitor(n) for n in range(streams)))
    return results


async def start_fake_llm(ttft: float, rate: float, reply: str = REPLY) -> tuple[web.AppRunner, str]:
    """A fake OpenAI-compatible LLM on a free port: (its runner, its base URL without /v1)."""
    fake = FakeOpenAI(first_token_delay=ttft, token_delay=1.0 / rate, default_reply=reply)
    runner = web.AppRunner(fake.app())
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    return runner, f"http://127.0.0.1:{port}"


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def main(args: argparse.Namespace) -> None:
    runner, llm = await start_fake_llm(args.ttft, args.rate)
    port = _free_port()
    parley = str(Path(sys.executable).with_name("parley"))
    with tempfile.TemporaryDirectory(prefix="parley-bench-turn-") as tmp:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PARLEY_", "OPENAI_"))}
        env |= {
            "PARLEY_DATA_DIR": str(Path(tmp) / "data"),
            "PARLEY_PORT": str(port),
            "PARLEY_LLM_BASE_URL": f"{llm}/v1",
            "PARLEY_LLM_API_KEY": "sk-bench",
            "PARLEY_LLM_MODEL": "bench",
            "PARLEY_LOG_LEVEL": "WARNING",
        }
        gateway = subprocess.Popen([parley, "serve", "--demo"], env=env, cwd=tmp)
        try:
            base = f"http://127.0.0.1:{port}"
            key = await _wait_for_demo(base, gateway)
            # Generous widget limits: this one address opens many streams on purpose.
            subprocess.run(
                [parley, "agent", "update", "demo", "--rate-limit-ip", "1000/1000",
                 "--rate-limit-session", "1000/1000"],
                env=env, check=True, capture_output=True,
            )  # fmt: skip
            await _gateway_turn(
                httpx.AsyncClient(base_url=base, timeout=60), key, "warm-up-000", QUESTIONS[0]
            )
            print(
                f"fake LLM: time to first token {args.ttft * 1000:.0f} ms, {args.rate:.0f} tokens/s; "
                f"{args.rounds} turns per stream\n"
            )
            rows = [
                (
                    "streams",
                    "turns",
                    "first event p50",
                    "p99",
                    "first token p50",
                    "p99",
                    "baseline p50",
                    "p99",
                    "added p50",
                    "added p99",
                )
            ]
            for streams in args.streams:
                r = await _level(base, llm, key, streams, args.rounds)
                e, t, b = r["event"], r["token"], r["baseline"]
                rows.append((
                    str(streams), str(len(t)),
                    f"{statistics.median(e):.1f}", f"{_pct(e, 99):.1f}",
                    f"{statistics.median(t):.1f}", f"{_pct(t, 99):.1f}",
                    f"{statistics.median(b):.1f}", f"{_pct(b, 99):.1f}",
                    f"{statistics.median(t) - statistics.median(b):.1f}",
                    f"{_pct(t, 99) - _pct(b, 99):.1f}",
                ))  # fmt: skip
            widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
            for number, row in enumerate(rows):
                print("  ".join(cell.rjust(w) for cell, w in zip(row, widths, strict=True)))
                if number == 0:
                    print("  ".join("-" * w for w in widths))
            print("\n(milliseconds; 'added' = gateway first token minus the direct baseline)")
        finally:
            gateway.terminate()
            gateway.wait(30)
            await runner.cleanup()


async def _wait_for_demo(base: str, gateway: subprocess.Popen[bytes]) -> str:
    async with httpx.AsyncClient(base_url=base, timeout=5) as client:
        for _ in range(600):
            if gateway.poll() is not None:
                raise RuntimeError("parley serve --demo exited")
            try:
                page = await client.get("/en/index.html")
                if page.status_code == 200:
                    match = re.search(r'data-key="([^"]+)"', page.text)
                    if match:
                        return match.group(1)
            except httpx.TransportError:
                pass
            await asyncio.sleep(0.2)
    raise RuntimeError("the demo did not come up within two minutes")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--ttft", type=float, default=0.2, help="fake LLM time to first token, s")
    parser.add_argument("--rate", type=float, default=50.0, help="fake LLM tokens per second")
    parser.add_argument("--rounds", type=int, default=4, help="turns per stream")
    parser.add_argument("--streams", type=int, nargs="+", default=[1, 10, 50])
    asyncio.run(main(parser.parse_args()))
