"""Run the all-in-one server as a container's PID 1 runs it: orphans become its children.

`python -m tests.system.faults.subreaper` marks itself a child subreaper (Linux
PR_SET_CHILD_SUBREAPER), then runs `python -m services` in the same process. The
postmaster that pg_ctl leaves behind is then this process's child, as it is under
the image's PID 1, and nothing but this process can reap it.
"""

from __future__ import annotations

import ctypes
import os
import runpy
import sys

PR_SET_CHILD_SUBREAPER = 36  # <linux/prctl.h>


def main() -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, os.strerror(errno), "prctl(PR_SET_CHILD_SUBREAPER)")
    sys.argv = ["services"]
    runpy.run_module("services", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
