"""Running the `parley` command as a user would: its own `main` on the given arguments,
environment and folder, or the real console script in a process of its own."""

from __future__ import annotations

import asyncio
import io
import logging
import os
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

PARLEY = str(Path(sys.executable).with_name("parley"))
_OURS = ("PARLEY_", "TWILIO_", "TELEGRAM_", "OPENAI_")


def clean_env(**overrides: str) -> dict[str, str]:
    """The current environment without Parley's variables, plus ``overrides``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(_OURS)}
    env.update(overrides)
    return env


def run_parley(
    *args: str, cwd: Path, timeout: float = 60, process: bool = False, **env: str
) -> subprocess.CompletedProcess[str]:
    """The command's exit status and what it printed.

    By default `gateway.cli.main` runs here, in this process, with exactly the environment
    and working folder a process of its own would have (restored afterwards): the same
    parsing, settings, database, printing and exit statuses, without starting Python and
    loading every library again for each command. ``process=True`` runs the installed
    console script instead, for what only a process shows: its start and exit (the embedded
    database stopped by the last process), signals, pipes, its first load."""
    if process:
        return subprocess.run(
            [PARLEY, *args],
            cwd=cwd,
            env=clean_env(**env),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
    return _in_this_process(list(args), cwd, clean_env(**env))


# One command at a time: the environment, folder and standard streams are the process's.
_ONE_AT_A_TIME = threading.Lock()


def _in_this_process(
    args: list[str], cwd: Path, env: dict[str, str]
) -> subprocess.CompletedProcess[str]:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return _command(args, cwd, env)
    # An async test: the command's own event loop runs on a thread of its own, and the
    # test waits for it as it would for a process.
    done: list[subprocess.CompletedProcess[str]] = []
    thread = threading.Thread(target=lambda: done.append(_command(args, cwd, env)))
    thread.start()
    thread.join()
    return done[0]


def _command(args: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    from gateway.cli import main

    out, err = io.StringIO(), io.StringIO()
    with _ONE_AT_A_TIME, _restored_process_state():
        os.environ.clear()
        os.environ.update(env)
        os.chdir(cwd)
        with redirect_stdout(out), redirect_stderr(err):
            try:
                status = main(args)
            except SystemExit as exc:  # argparse: --help (0) and usage errors (2)
                status = exc.code if isinstance(exc.code, int) else 0 if exc.code is None else 1
    return subprocess.CompletedProcess([PARLEY, *args], status, out.getvalue(), err.getvalue())


class _restored_process_state:
    """Environment, working folder and logging set up as they were before the command."""

    def __enter__(self) -> None:
        self._env = dict(os.environ)
        self._cwd = os.getcwd()
        root = logging.getLogger()
        self._handlers = root.handlers[:]
        self._levels = {
            name: logger.level
            for name, logger in logging.root.manager.loggerDict.items()
            if isinstance(logger, logging.Logger)
        }
        self._root_level = root.level

    def __exit__(self, *exc: object) -> None:
        os.environ.clear()
        os.environ.update(self._env)
        os.chdir(self._cwd)
        root = logging.getLogger()
        root.handlers[:] = self._handlers
        root.setLevel(self._root_level)
        for name, logger in logging.root.manager.loggerDict.items():
            if isinstance(logger, logging.Logger):
                logger.setLevel(self._levels.get(name, logging.NOTSET))


def wait_until_up(url: str, process: subprocess.Popen[str], timeout: float = 60) -> None:
    """Poll ``url`` until it answers 200, failing early if the process exits."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise AssertionError(f"parley exited early with status {process.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=1) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        time.sleep(0.1)
    raise AssertionError(f"{url} did not answer within {timeout} s")
