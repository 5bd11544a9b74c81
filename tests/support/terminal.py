"""A command under a pseudo-terminal, as a person runs it at a keyboard.

The command's stdin, stdout and stderr are the terminal, which is its controlling
terminal with the command in the foreground: Ctrl-C typed (`b"\\x03"`) is a SIGINT the
terminal sends, as a shell's terminal does, and readline sees a real terminal (arrow
keys, line editing). What it prints is read as it comes, on the test's event loop (the
server the command talks to may run on that loop: nothing here blocks it).
"""

from __future__ import annotations

import asyncio
import fcntl
import os
import pty
import re
import struct
import subprocess
import termios
from collections.abc import Mapping, Sequence

# Escape sequences (colours, cursor moves, bracketed paste) and carriage returns, which
# a person does not read.
_ESCAPES = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b[()][A-Za-z0-9]|\x1b[=>]|\r")

UP = b"\x1b[A"
CTRL_C = b"\x03"
CTRL_D = b"\x04"


def plain(text: str) -> str:
    """Terminal output as the words on the screen (escape sequences and \\r dropped)."""
    return _ESCAPES.sub("", text)


class Terminal:
    """A process on a pseudo-terminal: `type` keys, `expect` what it prints, `exit_code`."""

    def __init__(self, process: subprocess.Popen[bytes], master: int) -> None:
        self.process = process
        self.master = master
        self.raw = bytearray()
        self._seen = 0  # where the next `expect` starts looking (in `text`)
        self._more = asyncio.Event()
        self.closed = False
        asyncio.get_running_loop().add_reader(master, self._read)

    @classmethod
    async def start(
        cls,
        argv: Sequence[str],
        env: Mapping[str, str],
        *,
        columns: int = 200,
        rows: int = 50,
    ) -> Terminal:
        master, slave = pty.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", rows, columns, 0, 0))

        def controlling_terminal() -> None:  # in the child: a session whose terminal it is
            os.setsid()
            fcntl.ioctl(0, termios.TIOCSCTTY, 0)

        # A fork and exec, at once: not worth a thread (asyncio's subprocess cannot make
        # the terminal the child's controlling one).
        process = subprocess.Popen(  # noqa: ASYNC220
            list(argv),
            stdin=slave,
            stdout=slave,
            stderr=slave,
            env=dict(env),
            preexec_fn=controlling_terminal,  # setsid + TIOCSCTTY, nothing else
            close_fds=True,
        )
        os.close(slave)
        os.set_blocking(master, False)
        return cls(process, master)

    def _read(self) -> None:
        try:
            chunk = os.read(self.master, 65536)
        except BlockingIOError:
            return
        except OSError:  # EIO: every process holding the terminal has closed it
            chunk = b""
        if not chunk:
            asyncio.get_running_loop().remove_reader(self.master)
            self.closed = True
        self.raw += chunk
        self._more.set()

    @property
    def text(self) -> str:
        """Everything printed so far, as read on the screen."""
        return plain(self.raw.decode(errors="replace"))

    def type(self, keys: bytes | str) -> None:
        """Keys typed at the terminal (`b"\\r"` is Enter)."""
        os.write(self.master, keys.encode() if isinstance(keys, str) else keys)

    async def expect(self, pattern: str, timeout: float = 60.0) -> re.Match[str]:
        """Wait until what is printed after the last match matches `pattern` (a regular
        expression); the match. Fails with what was printed when the deadline passes or
        the terminal closes first."""
        wanted = re.compile(pattern)

        async def found() -> re.Match[str]:
            while True:
                match = wanted.search(self.text, self._seen)
                if match is not None:
                    self._seen = match.end()
                    return match
                if self.closed:
                    raise AssertionError(f"closed before {pattern!r}:\n{self.text}")
                self._more.clear()
                await self._more.wait()

        try:
            return await asyncio.wait_for(found(), timeout)
        except TimeoutError:
            raise AssertionError(f"no {pattern!r} within {timeout} s:\n{self.text}") from None

    async def exit_code(self, timeout: float = 60.0) -> int:
        """The exit status, once the process ends (reading what it prints until then)."""
        code = await asyncio.wait_for(asyncio.to_thread(self.process.wait), timeout)
        while not self.closed:  # what it printed last
            self._more.clear()
            try:
                await asyncio.wait_for(self._more.wait(), 5)
            except TimeoutError:
                break
        return code

    def close(self) -> None:
        """Kill the process if it still runs, and close the terminal."""
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        if not self.closed:
            asyncio.get_running_loop().remove_reader(self.master)
            self.closed = True
        os.close(self.master)
