"""Ctrl-C in the `runifold` command: KeyboardInterrupt, as Python's default handler
raises, and a watchdog that ends the process with 130 if what unwinds after it hangs (a
stream's close on a server that stopped answering, a loaded machine): a person pressed
it to leave now. A prompt that takes Ctrl-C as an answer calls `handled()`."""

from __future__ import annotations

import os
import threading

INTERRUPTED = 130  # SIGINT: Ctrl-C
# How long the clean-up (closing streams and the channel) may take after a Ctrl-C.
CLEANUP_S = 5.0
_watchdogs: list[threading.Timer] = []


def interrupted(signum: int, frame: object) -> None:
    """The SIGINT handler."""
    watchdog = threading.Timer(CLEANUP_S, os._exit, (INTERRUPTED,))
    watchdog.daemon = True
    _watchdogs.append(watchdog)
    watchdog.start()
    raise KeyboardInterrupt


def handled() -> None:
    """The Ctrl-C was an answer (the program goes on): no watchdog."""
    while _watchdogs:
        _watchdogs.pop().cancel()
