"""Create, stop and start a pgserver PostgreSQL from a process of its own.

`python -m tests.system.faults.pgctl init DIR` prints {"url", "socket_dir", "user"};
`stop DIR USER MODE` and `start DIR USER SOCKET_DIR` run pg_ctl as pgserver does.

Why a process of its own: as root, pgserver runs initdb and pg_ctl as another
user, so Python forks (no vfork) and then switches user. Forked from a test
process whose gRPC threads are busy, that child can crash before it execs
(pg_ctl "died with SIGSEGV" here). This module imports no gRPC, and the test
process starts it with a plain spawn.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def main(argv: list[str]) -> None:
    import pgserver
    from pgserver._commands import pg_ctl

    command, pgdata = argv[0], Path(argv[1])
    if command == "init":
        # cleanup_mode None: the server outlives this process; the test stops it.
        server = pgserver.get_server(pgdata, cleanup_mode=None)
        info = server.get_postmaster_info()
        print(
            json.dumps(
                {
                    "url": server.get_uri(),
                    "socket_dir": str(info.socket_dir),
                    "user": server.system_user or "",
                }
            )
        )
        return
    user = argv[2] or None
    if command == "stop":
        pg_ctl(["-w", "-m", argv[3], "stop"], pgdata=pgdata, user=user, timeout=60)
    elif command == "start":
        pg_ctl(
            ["-w", "-o", '-h ""', "-o", f"-k {argv[3]}", "-l", str(pgdata / "log"), "start"],
            pgdata=pgdata,
            user=user,
            timeout=60,
        )
    else:
        raise SystemExit(f"unknown command {command!r}")


if __name__ == "__main__":
    main(sys.argv[1:])
