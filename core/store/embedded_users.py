"""The processes using an embedded PostgreSQL, as its package lists them in the data folder."""

from __future__ import annotations

import json
import logging
import os
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

# The server package's list of the processes using the server, in its data folder.
USERS_FILE = ".handle_pids.json"


def forget_dead_users(pgdata: Path, lock: AbstractContextManager[Any]) -> list[int]:
    """Take processes that no longer exist off the list of the server's users; return the rest.

    The package stops the server when the last process on that list lets go; a process that
    was killed (SIGKILL, the OOM killer) never takes itself off, so without this the server
    would outlive every graceful stop after it. The list is read and written under the
    package's own inter-process lock, the one it holds while changing the list.
    """
    path = pgdata / USERS_FILE
    with lock:
        try:
            stored = json.loads(path.read_text())
        except FileNotFoundError:
            return []
        except ValueError:
            stored = None  # unreadable: rebuilt from the processes that join from now on
        pids = stored if isinstance(stored, list) else []
        alive = [pid for pid in pids if isinstance(pid, int) and _running(pid)]
        if alive != stored:
            path.write_text(json.dumps(alive))
            log.info("store.embedded.pruned pgdata=%s gone=%d", pgdata, len(pids) - len(alive))
        return alive


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process: it exists
    return True
