"""What the benchmarks that start servers share: a free port, waiting for /health (both from
tests/helpers.py), a process's RSS and CPU time."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from helpers import free_port  # noqa: E402,F401  (re-exported for the benchmarks)
from helpers import wait_healthy as _wait_healthy  # noqa: E402


def rss_mib(pid: int) -> float:
    """Resident set size of ``pid`` in MiB (0.0 if /proc does not say)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def cpu_seconds(pid: int) -> float:
    """CPU time (user + system) ``pid`` has used so far: what its work cost, whatever else runs."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def wait_healthy(url: str, proc: subprocess.Popen, timeout: float = 300.0, log: Path | None = None) -> None:
    """tests/helpers.py's ``wait_healthy``; a server writing to ``log`` instead of a pipe has
    the end of that log in the error if it exits first."""
    try:
        _wait_healthy(url, proc, timeout)
    except RuntimeError as exc:
        tail = log.read_text()[-2000:] if log is not None and log.exists() else ""
        raise RuntimeError(f"{exc}{tail}") from None
