"""PostgreSQL servers for the chaos campaign, run from a process of its own.

`python -m chaos.pgctl COMMAND ...` (prints JSON where it answers something):

- `init DIR PORT`: a new cluster in DIR (initdb, trust authentication), configured for
  streaming replication with a synchronous standby named `standby`, started on
  127.0.0.1:PORT;
- `standby PRIMARY_PORT DIR PORT`: a streaming standby of the primary, made with
  pg_basebackup, started on 127.0.0.1:PORT;
- `start DIR`, `stop DIR MODE` (fast | immediate), `kill DIR` (SIGKILL of the postmaster:
  a crash), `promote DIR` (the standby becomes the primary, and stops waiting for a
  synchronous standby of its own).

pgserver's binaries (PostgreSQL 16, the ones the project runs on). As root, PostgreSQL
runs as pgserver's system user; the user switch happens in a forked child, which is why
this runs in a process that imports no gRPC (tests/system/faults/pgctl.py says more).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pgserver  # noqa: F401  (finds the binaries)
from pgserver._commands import POSTGRES_BIN_PATH

USER = "postgres"
STANDBY_NAME = "standby"


def _system_user() -> str | None:
    if os.geteuid() != 0:
        return None
    from pgserver.utils import ensure_prefix_permissions, ensure_user_exists

    ensure_user_exists("pgserver")
    ensure_prefix_permissions(POSTGRES_BIN_PATH)
    return "pgserver"


def _run(binary: str, *args: str, user: str | None, timeout: float = 120) -> str:
    completed = subprocess.run(
        [str(POSTGRES_BIN_PATH / binary), *args],
        check=False,
        capture_output=True,
        text=True,
        timeout=timeout,
        user=user,
    )
    if completed.returncode != 0:
        raise SystemExit(f"{binary} {' '.join(args)} failed:\n{completed.stderr[-3000:]}")
    return completed.stdout


def _own(path: Path, user: str | None) -> None:
    path.mkdir(parents=True, exist_ok=True)
    if user is not None:
        import pwd

        entry = pwd.getpwnam(user)
        os.chown(path, entry.pw_uid, entry.pw_gid)
        path.chmod(0o700)


def _configure(data: Path, port: int, *, primary: bool) -> None:
    settings = {
        "listen_addresses": "'127.0.0.1'",
        "port": str(port),
        "unix_socket_directories": "''",
        "wal_level": "replica",
        "max_wal_senders": "8",
        "hot_standby": "on",
        "fsync": "on",
        "synchronous_commit": "on",
        # No statement text, DETAIL or CONTEXT in the server's log (the services' rule).
        "log_error_verbosity": "terse",
        "log_min_error_statement": "panic",
        "max_connections": "200",
    }
    if primary:
        settings["synchronous_standby_names"] = "''"
    with (data / "postgresql.auto.conf").open("a") as conf:
        for key, value in settings.items():
            conf.write(f"{key} = {value}\n")


def _start(data: Path, user: str | None) -> None:
    _run("pg_ctl", "-D", str(data), "-w", "-l", str(data / "log"), "start", user=user)


def _postmaster_pid(data: Path) -> int:
    return int((data / "postmaster.pid").read_text().splitlines()[0])


def main(argv: list[str]) -> None:
    user = _system_user()
    command = argv[0]
    if command == "init":
        data, port = Path(argv[1]), int(argv[2])
        _own(data, user)
        _run(
            "initdb",
            "-D",
            str(data),
            "--auth=trust",
            "--encoding=utf8",
            "-U",
            USER,
            user=user,
        )
        _configure(data, port, primary=True)
        _start(data, user)
        print(json.dumps({"port": port}))
    elif command == "standby":
        primary_port, data, port = int(argv[1]), Path(argv[2]), int(argv[3])
        _own(data, user)
        _run(
            "pg_basebackup",
            "-h",
            "127.0.0.1",
            "-p",
            str(primary_port),
            "-U",
            USER,
            "-D",
            str(data),
            "-R",
            "-X",
            "stream",
            "--checkpoint=fast",
            user=user,
        )
        with (data / "postgresql.auto.conf").open("a") as conf:
            conf.write(
                f"primary_conninfo = 'host=127.0.0.1 port={primary_port} user={USER} "
                f"application_name={STANDBY_NAME}'\n"
            )
            conf.write(f"port = {port}\n")
        _start(data, user)
        print(json.dumps({"port": port}))
    elif command == "start":
        _start(Path(argv[1]), user)
    elif command == "stop":
        _run("pg_ctl", "-D", argv[1], "-w", "-m", argv[2], "stop", user=user)
    elif command == "kill":
        data = Path(argv[1])
        pid = _postmaster_pid(data)
        os.kill(pid, signal.SIGKILL)
        # Its backends notice the postmaster is gone and exit by themselves.
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.05)  # polling a dying process
    elif command == "promote":
        data = Path(argv[1])
        _run("pg_ctl", "-D", str(data), "-w", "promote", user=user)
        listening = argv[2]
        # A lone primary must not wait for a synchronous standby it no longer has.
        _run(
            "psql",
            "-h",
            "127.0.0.1",
            "-p",
            listening,
            "-U",
            USER,
            "-d",
            "postgres",
            "-c",
            "ALTER SYSTEM SET synchronous_standby_names = ''",
            "-c",
            "SELECT pg_reload_conf()",
            user=user,
        )
    elif command == "sync":
        # Make the primary wait for the standby at every commit.
        listening = argv[1]
        _run(
            "psql",
            "-h",
            "127.0.0.1",
            "-p",
            listening,
            "-U",
            USER,
            "-d",
            "postgres",
            "-c",
            f"ALTER SYSTEM SET synchronous_standby_names = '{STANDBY_NAME}'",
            "-c",
            "SELECT pg_reload_conf()",
            user=user,
        )
    else:
        raise SystemExit(f"unknown command {command!r}")


if __name__ == "__main__":
    main(sys.argv[1:])
