"""The embedded PostgreSQL: a real server from the pgserver package, started (or
reused) for the embedded default and tests, with what a killed process or a killed
server left behind cleared first, so that a restart needs no manual step.

Its log keeps no data: an error's primary message only (`QUIET_SERVER_LOG`). The
pool that connects to it (or to DATABASE_URL's server) is services/common/postgres/pool.py.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import logging
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import psutil  # type: ignore[import-untyped]  # no type stubs
import psycopg
from psycopg import sql
from psycopg.rows import TupleRow

log = logging.getLogger(__name__)

# The embedded PostgreSQL's logging, set with ALTER SYSTEM at every start: an error's
# primary message only (no DETAIL, HINT, QUERY or CONTEXT, where the data is), and no
# statement text after an error. DATABASE_URL's server is the operator's to set
# alike (docs/production.md).
QUIET_SERVER_LOG = {"log_error_verbosity": "terse", "log_min_error_statement": "panic"}


# How long the embedded PostgreSQL may take to come up after a crash: waiting for
# a postmaster that is still starting or stopping, and for the orphaned backends of
# a killed one to exit. pg_ctl's own default wait (PGCTLTIMEOUT) is the same.
EMBEDDED_START_TIMEOUT_S = 60.0
# Orphaned backends get SIGQUIT, then SIGKILL after this long: what a postmaster
# does to its children after one of them crashed (SIGKILL_CHILDREN_AFTER_SECS).
_ORPHAN_KILL_AFTER_S = 5.0
# How often the start-up waits look again at the postmaster and the backends.
_POLL_S = 0.05
# pgserver keeps the ids of the processes using a data directory in this file
# and stops PostgreSQL when the last one exits (pgserver/postgres_server.py).
_HANDLES = ".handle_pids.json"


class EmbeddedPostgresError(RuntimeError):
    """The embedded PostgreSQL could not be started or recovered."""


def import_pgserver() -> Any:
    """The pgserver module, imported without platformdirs' runtime-directory warning.

    pgserver asks platformdirs for the user's runtime directory (for its inter-process
    lock) when it is imported. Outside a desktop session XDG_RUNTIME_DIR is unset (or
    a shared /tmp), and platformdirs warns, then falls back to a private directory
    of its own, which is what the lock needs: the warning tells nobody anything.
    """
    import warnings

    import platformdirs

    category = getattr(platformdirs, "RuntimeDirWarning", UserWarning)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", category)
        import pgserver
    return pgserver


def start_embedded_postgres(data_dir: Path, timeout: float = EMBEDDED_START_TIMEOUT_S) -> str:
    """Start (or reuse) a real PostgreSQL from the pgserver package; return its URL.

    The server keeps running while this process lives and stops with it (with
    the last process using it, when several share the data directory). What a
    killed process or a killed PostgreSQL left behind is cleared first, so that
    a restart needs no manual step (`_recover`).
    """
    pgserver = import_pgserver()
    from pgserver.postgres_server import PostgresServer

    data_dir.mkdir(parents=True, exist_ok=True)
    pgdata = data_dir.resolve()
    deadline = time.monotonic() + timeout
    # pgserver's own inter-process lock: the processes sharing a data directory
    # recover, start and register one at a time. Released before get_server,
    # which takes it itself.
    with PostgresServer._lock:
        _recover(pgdata, deadline, timeout)
    try:
        server = pgserver.get_server(str(pgdata), cleanup_mode="stop")
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as exc:
        raise EmbeddedPostgresError(
            f"embedded PostgreSQL in {pgdata} did not start ({exc}); "
            f"the end of its log ({pgdata / 'log'}):\n{_log_tail(pgdata)}"
        ) from exc
    # Run before pgserver's stop at exit (atexit is last in, first out).
    atexit.register(_reap_if_dead_child, int(server.get_pid()))
    url: str = server.get_uri()
    quiet_server_log(url)
    log.info("embedded postgresql started", extra={"data_dir": str(data_dir)})
    return url


def quiet_server_log(url: str, timeout: float = 10.0) -> None:
    """Keep data out of the embedded server's log (QUIET_SERVER_LOG), for every session
    from now on: ALTER SYSTEM (kept in postgresql.auto.conf, so a restart keeps it)
    and a reload. pgserver passes no settings of its own; these are set again at each
    start, which also covers a data directory made before they existed.

    Returns once the reload took effect: the postmaster reads the file, then signals
    its sessions, this one among them; a session started after that has the settings.
    """
    deadline = time.monotonic() + timeout
    with psycopg.connect(url, autocommit=True) as conn:
        for name, value in QUIET_SERVER_LOG.items():
            conn.execute(
                sql.SQL("ALTER SYSTEM SET {} = {}").format(sql.Identifier(name), sql.Literal(value))
            )
        conn.execute("SELECT pg_reload_conf()")
        while not _applied(conn, QUIET_SERVER_LOG):
            if time.monotonic() > deadline:
                raise EmbeddedPostgresError(
                    f"the embedded PostgreSQL did not apply {QUIET_SERVER_LOG} within {timeout:g} s"
                )
            time.sleep(_POLL_S)  # a synchronous start-up wait: nothing else runs yet


def _applied(conn: psycopg.Connection[TupleRow], settings: dict[str, str]) -> bool:
    """True when this session has each setting at its value."""
    for name, value in settings.items():
        row = conn.execute("SELECT current_setting(%s)", (name,)).fetchone()
        if row is None or row[0] != value:
            return False
    return True


def _reap_if_dead_child(pid: int) -> None:
    """Reap the postmaster if it died as this process's child.

    In a container this server is PID 1 (the image runs no init), so the
    postmaster pg_ctl leaves behind is its child, and one killed under it stays a
    zombie: nothing else reaps it. pgserver's stop at exit takes the zombie for a
    running server and waits out `pg_ctl stop` (a minute) before it gives up.
    """
    with contextlib.suppress(ChildProcessError):  # not our child: init reaps it
        os.waitpid(pid, os.WNOHANG)  # a live child is left alone


def _recover(pgdata: Path, deadline: float, timeout: float) -> None:
    """Leave the data directory as pgserver 0.1.4 expects it after a clean stop.

    pgserver trusts its files, and a `kill -9` leaves them stale:
    - `.handle_pids.json` keeps a killed process's id, so pgserver never sees the
      last handle go and a later clean shutdown leaves PostgreSQL running;
    - `postmaster.pid` of a killed postmaster whose id is still taken (a zombie
      not reaped yet, or a reused id) reads as a running server, and pgserver
      hands out the URL of a server that is not there;
    - a postmaster that is still starting (crash recovery) or stopping fails
      pgserver's `status == 'ready'` assertion;
    - backends outliving their killed postmaster (busy in a query, they notice
      late) keep its shared memory attached, and a new postmaster refuses to
      start ("pre-existing shared memory block is still in use").
    """
    _forget_dead_handles(pgdata)
    hurried: set[int] = set()
    while True:
        pid, fields = _read_postmaster_pid(pgdata)
        if pid is None or not _is_postgres_of(pid, pgdata):
            # No live postmaster: every postgres process of this directory is an orphan.
            _end_orphans(pgdata, deadline)
            _remove_stale_lock_files(pgdata, pid, fields)
            return
        status = fields[7].strip() if len(fields) > 7 else ""
        if status == "ready":
            return  # pgserver reuses it
        if status == "stopping" and pid not in hurried:
            # Someone asked it to stop; a smart shutdown (SIGTERM) waits for every
            # client to leave, possibly for ever. Turn it into a fast one (SIGINT,
            # what `pg_ctl stop` and pgserver's own stop use): sessions are ended
            # and open transactions roll back. It is then started afresh.
            log.warning(
                "embedded postgresql: a server is stopping; hurrying it and waiting",
                extra={"data_dir": str(pgdata), "pid": pid},
            )
            with contextlib.suppress(psutil.Error):
                psutil.Process(pid).send_signal(signal.SIGINT)
            hurried.add(pid)
        if time.monotonic() > deadline:
            raise EmbeddedPostgresError(
                f"embedded PostgreSQL in {pgdata} (pid {pid}) is still {status or 'starting'!r} "
                f"after {timeout:g} s; see its log ({pgdata / 'log'}):\n{_log_tail(pgdata)}"
            )
        time.sleep(_POLL_S)  # a synchronous start-up wait: nothing else runs yet


def _forget_dead_handles(pgdata: Path) -> None:
    """Drop the ids of processes that are gone from pgserver's handle list.

    A process younger than the list's last write cannot be in it: its id was
    reused after the registered process died.
    """
    path = pgdata / _HANDLES
    try:
        written = path.stat().st_mtime
        pids = [int(pid) for pid in json.loads(path.read_text())]
    except FileNotFoundError:
        return
    except (ValueError, TypeError):
        pids, written = [], 0.0  # unreadable: pgserver would fail on it
    alive = []
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            process = psutil.Process(pid)
            # 1 s of slack: psutil derives create_time from clock ticks since boot.
            if process.status() != psutil.STATUS_ZOMBIE and process.create_time() <= written + 1:
                alive.append(pid)
    if alive != pids or written == 0.0:
        log.warning(
            "embedded postgresql: forgetting handles of processes that are gone",
            extra={"data_dir": str(pgdata), "gone": sorted(set(pids) - set(alive))},
        )
        path.write_text(json.dumps(alive))


def _read_postmaster_pid(pgdata: Path) -> tuple[int | None, list[str]]:
    """The postmaster's id and the lines of postmaster.pid (None, [] when absent).

    Read here rather than with pgserver's PostmasterInfo, which asserts that the
    file is complete (a postmaster killed while starting leaves it short).
    """
    try:
        fields = (pgdata / "postmaster.pid").read_text().splitlines()
    except FileNotFoundError:
        return None, []
    try:
        return int(fields[0]), fields
    except (IndexError, ValueError):
        return None, fields


def _is_postgres_of(pid: int, pgdata: Path) -> bool:
    """True when `pid` is a live (not zombie) postgres process of this data directory."""
    try:
        process = psutil.Process(pid)
        return _alive(process) and _runs_in(process, pgdata)
    except psutil.AccessDenied:
        return True  # cannot tell (another user's process): leave it to pgserver
    except psutil.Error:
        return False


def _runs_in(process: psutil.Process, pgdata: Path) -> bool:
    # Every postgres process works in its data directory (the postmaster changes
    # to it; backends inherit it); their command lines do not name it.
    return bool(process.name() == "postgres" and Path(process.cwd()) == pgdata)


def _postgres_processes(pgdata: Path) -> list[psutil.Process]:
    found = []
    for process in psutil.process_iter():
        with contextlib.suppress(psutil.Error):
            if _runs_in(process, pgdata):
                found.append(process)
    return found


def _end_orphans(pgdata: Path, deadline: float) -> None:
    """Stop the postgres processes left by a dead postmaster (SIGQUIT, then SIGKILL).

    They do no useful work without it, and the write-ahead log makes stopping
    them safe: the next postmaster runs crash recovery.
    """
    orphans = _postgres_processes(pgdata)
    if not orphans:
        return
    log.warning(
        "embedded postgresql: stopping backends left by a dead postmaster",
        extra={"data_dir": str(pgdata), "pids": [p.pid for p in orphans]},
    )
    for process in orphans:
        with contextlib.suppress(psutil.Error):
            process.send_signal(signal.SIGQUIT)
    alive = _wait_gone(orphans, min(deadline, time.monotonic() + _ORPHAN_KILL_AFTER_S))
    for process in alive:
        with contextlib.suppress(psutil.Error):
            process.kill()
    alive = _wait_gone(alive, deadline)
    if alive:
        raise EmbeddedPostgresError(
            f"postgres processes {[p.pid for p in alive]} of {pgdata} do not exit"
        )


def _wait_gone(processes: list[psutil.Process], until: float) -> list[psutil.Process]:
    """Wait until the processes have exited (by `until`); return those still alive.

    A zombie counts as gone: it holds no shared memory, and its parent (init, or
    the nearest subreaper) may take a while to reap it.
    """
    while True:
        alive = [p for p in processes if _alive(p)]
        if not alive or time.monotonic() >= until:
            return alive
        time.sleep(_POLL_S)


def _alive(process: psutil.Process) -> bool:
    try:
        return bool(process.is_running() and process.status() != psutil.STATUS_ZOMBIE)
    except psutil.Error:
        return False


def _remove_stale_lock_files(pgdata: Path, pid: int | None, fields: list[str]) -> None:
    """Remove the lock files of a postmaster that is gone (no postgres of this
    directory runs now). PostgreSQL removes its own stale lock files only when
    their pid is free; a zombie's or a reused pid makes it refuse to start."""
    if not fields:
        return
    if len(fields) > 4 and fields[3].strip() and fields[4].strip():
        lock = Path(fields[4].strip()) / f".s.PGSQL.{fields[3].strip()}.lock"
        with contextlib.suppress(OSError, IndexError):
            if lock.read_text().splitlines()[0].strip() == str(pid):
                lock.unlink()
    log.warning(
        "embedded postgresql: removing the postmaster.pid of a server that is gone",
        extra={"data_dir": str(pgdata), "pid": pid},
    )
    (pgdata / "postmaster.pid").unlink(missing_ok=True)


def _log_tail(pgdata: Path, lines: int = 20) -> str:
    try:
        return "\n".join((pgdata / "log").read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"
