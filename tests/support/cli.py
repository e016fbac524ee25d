"""Running the real `parley` console script in a subprocess, as a user would."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

PARLEY = str(Path(sys.executable).with_name("parley"))
_OURS = ("PARLEY_", "TWILIO_", "TELEGRAM_", "OPENAI_")


def clean_env(**overrides: str) -> dict[str, str]:
    """The current environment without Parley's variables, plus ``overrides``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(_OURS)}
    env.update(overrides)
    return env


def run_parley(
    *args: str, cwd: Path, timeout: float = 60, **env: str
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [PARLEY, *args],
        cwd=cwd,
        env=clean_env(**env),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


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
