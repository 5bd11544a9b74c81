"""docs/errors.md lists every ErrorInfo reason the services can send."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
_RAISES = re.compile(
    r"(?:invalid_argument|not_found|aborted|failed_precondition|already_exists|"
    r"resource_exhausted|permission_denied)\(\s*\"([A-Z][A-Z_]+)\""
    r"|DomainError\(\s*Code\.[A-Z_]+,\s*\"([A-Z][A-Z_]+)\""
    r"|\breason=\"([A-Z][A-Z_]+)\"",
)


def reasons_in_code() -> set[str]:
    found: set[str] = set()
    for path in (ROOT / "services").rglob("*.py"):
        for match in _RAISES.finditer(path.read_text()):
            found.add(match[1] or match[2] or match[3])
    return found


def test_every_reason_is_documented() -> None:
    documented = set(re.findall(r"`([A-Z][A-Z_]+)`", (ROOT / "docs/errors.md").read_text()))
    reasons = reasons_in_code()
    assert len(reasons) > 40, "the pattern still finds the raises"
    assert reasons <= documented, f"undocumented reasons: {sorted(reasons - documented)}"
