"""`make bench`: each benchmark runs several times and docs/PERFORMANCE.md gets the medians."""

from __future__ import annotations

import json
import os
import re
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

import bench.all as bench_all
from bench.all import BEGIN, END, Bench, profile_summary, write_page

ROOT = Path(__file__).resolve().parents[2]


def test_the_page_gives_the_median_of_three_runs_beside_the_floor(
    tmp_path: Path, postgres_url: str
) -> None:
    page = tmp_path / "PERFORMANCE.md"
    page.write_text("# Performance\n\nA reading written by hand.\n")
    logs = tmp_path / "logs"
    done = subprocess.run(
        [sys.executable, "-m", "bench.all", "--quick", "--only", "memory", "--runs", "3",
         "--no-profile", "--output", str(page), "--logs", str(logs)],
        cwd=ROOT, env={**os.environ, "PARLEY_DATABASE_URL": postgres_url},
        capture_output=True, text=True, timeout=240, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    runs = [
        [json.loads(line) for line in (logs / f"memory-{n}.jsonl").read_text().splitlines()]
        for n in (1, 2, 3)
    ]
    p99 = [next(f for f in run if f["name"].startswith("rebuild p99")) for run in runs]
    text = page.read_text()
    assert text.startswith("# Performance\n\nA reading written by hand.\n")
    row = next(line for line in text.splitlines() if line.startswith(f"| {p99[0]['name']} |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    median = statistics.median(f["value"] for f in p99)
    floor = statistics.median(f["floor"] for f in p99)
    assert float(cells[1].split()[0]) == float(_rounded(median))
    assert cells[3] == f"{_rounded(floor)} ms"
    assert cells[4] == f"{median / floor:.2f}×"
    assert cells[5] == "< 5.00 ms"
    assert cells[6] == ("met" if median < 5 else "**missed**")
    assert re.search(r"3 runs of \d+ s", text)


def _rounded(value: float) -> str:
    return f"{value:.1f}" if value >= 10 else f"{value:.2f}" if value >= 0.1 else f"{value:.3f}"


def test_a_new_run_replaces_only_the_figures(tmp_path: Path) -> None:
    page = tmp_path / "PERFORMANCE.md"
    write_page(page, ["old figures"])
    page.write_text("Reading above.\n\n" + page.read_text() + "\nReading below.\n")
    write_page(page, ["new figures"])
    text = page.read_text()
    assert "old figures" not in text
    assert text.index("Reading above.") < text.index(BEGIN) < text.index("new figures")
    assert text.index("new figures") < text.index(END) < text.index("Reading below.")


def test_a_profile_says_which_functions_held_the_cpu_in_each_process() -> None:
    serve = 'process 7:"/srv/.venv/bin/python /srv/.venv/bin/parley serve --no-workers"'
    load = 'process 9:"/srv/.venv/bin/python -m bench.webhooks"'
    raw = "\n".join([
        f"{serve};run (core/jobs/inbox_worker.py:10);encode (core/retrieval/embedders.py:5) 60",
        f"{serve};run (core/jobs/inbox_worker.py:10);execute (/x/asyncpg/pool.py:9) 30",
        f"{serve};select (/usr/lib/python3.11/selectors.py:468) 10",
        f"{load};post (/x/aiohttp/client.py:1) 40",
    ])  # fmt: skip
    lines = profile_summary(raw)
    assert lines[0] == "- `parley serve`: 100 samples on the CPU"
    assert lines[1].startswith(
        "  - held the CPU themselves: `retrieval.embedders.encode` 60%, `pool.execute` 30%"
    )
    assert lines[2] == (
        "  - Parley's functions, with what they call: `jobs.inbox_worker.run` 90%, "
        "`retrieval.embedders.encode` 60%"
    )
    assert lines[3] == "- `bench.webhooks`: 40 samples on the CPU"


def test_a_benchmark_with_its_own_phases_loads_once_and_gives_their_median(
    tmp_path: Path, postgres_url: str
) -> None:
    page = tmp_path / "PERFORMANCE.md"
    logs = tmp_path / "logs"
    done = subprocess.run(
        [sys.executable, "-m", "bench.all", "--quick", "--only", "retrieval", "--runs", "3",
         "--no-profile", "--output", str(page), "--logs", str(logs)],
        cwd=ROOT, env={**os.environ, "PARLEY_DATABASE_URL": postgres_url},
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    figures = [json.loads(line) for line in (logs / "retrieval.jsonl").read_text().splitlines()]
    full = [f["value"] for f in figures if f["name"] == "full retrieve p50"]
    assert len(full) == 3  # one per query phase, from a single load
    assert sum(f["name"] == "load" for f in figures) == 1
    text = page.read_text()
    assert "--runs 3`: one run of" in text
    row = next(line for line in text.splitlines() if line.startswith("| full retrieve p50 |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert float(cells[1].split()[0]) == float(_rounded(statistics.median(full)))
    assert cells[5] == "< 20.0 ms"


def test_the_process_py_spy_started_is_named_by_its_command() -> None:
    # py-spy cannot read the command line of the process it starts itself.
    raw = 'process 3:"";run (bench/retrieval.py:4);fetch (/x/asyncpg/pool.py:9) 25'
    assert profile_summary(raw, first="bench.retrieval")[0] == (
        "- `bench.retrieval`: 25 samples on the CPU"
    )


def test_a_failed_benchmark_is_named_and_the_others_are_kept(
    tmp_path: Path, postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    earlier = Bench("earlier", "A benchmark measured before", ("-c", "pass"))
    broken = Bench("broken", "A benchmark that crashes", ("-c", "raise SystemExit(3)"))
    memory = next(b for b in bench_all.BENCHES if b.key == "memory")
    monkeypatch.setattr(bench_all, "BENCHES", (earlier, broken, memory))
    monkeypatch.setenv("PARLEY_DATABASE_URL", postgres_url)
    page, logs = tmp_path / "PERFORMANCE.md", tmp_path / "logs"
    write_page(page, ["Header", "", "### A benchmark measured before", "", "| kept | 1 ms |"])
    monkeypatch.setattr(sys, "argv", ["bench.all", "--quick", "--runs", "1", "--no-profile",
                                      "--only", "broken", "--only", "memory",
                                      "--output", str(page), "--logs", str(logs)])  # fmt: skip
    assert bench_all.main() == 1
    text = page.read_text()
    kept = text.index("### A benchmark measured before\n\n| kept | 1 ms |")
    crashed = text.index("### A benchmark that crashes\n\nFailed: broken failed (exit 3)")
    measured = text.index("### Conversation memory rebuilt from Postgres")
    assert kept < crashed < measured  # in the benchmarks' order
    assert "| rebuild p99 (in-process cache) |" in text
    assert re.search(r"Measured \d{4}-\d\d-\d\d, commit \w+", text[measured:])
