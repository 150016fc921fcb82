"""README.md's quickstart runs as written: every code block, in order, in a scratch directory.

A bash block that starts ``rlgate serve`` is the "first terminal": it is started in the
background and waited on until the gateway answers. Python blocks whose first line is
``# NAME.py`` are saved under that name (the README says to save them). Other bash
blocks run to completion and must succeed. ``PORT`` is set to a free port (the README's
commands read it, defaulting to 8000).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import free_port, wait_healthy

README = Path(__file__).resolve().parents[1] / "README.md"


def quickstart_blocks() -> list[tuple[str, str]]:
    text = README.read_text()
    section = text.split("## Quickstart", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```(\w+)\n(.*?)```", section, flags=re.S)


def test_the_quickstart_has_the_blocks_this_test_knows_how_to_run():
    kinds = [k for k, _ in quickstart_blocks()]
    assert kinds == ["bash", "python", "bash"]
    assert "rlgate serve" in quickstart_blocks()[0][1]
    assert quickstart_blocks()[1][1].startswith("# quickstart.py")


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_readme_quickstart_runs_verbatim(tmp_path):
    port = free_port()
    env = {**os.environ, "PORT": str(port), "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    env.pop("RLGATE_ADMIN_KEY", None)  # the README's gateway generates its key and writes admin.key
    server = None
    outputs = []
    try:
        for kind, code in quickstart_blocks():
            if kind == "python":
                name = code.splitlines()[0].removeprefix("#").strip()
                (tmp_path / name).write_text(code)
            elif "rlgate serve" in code:
                server = subprocess.Popen(["bash", "-ec", code], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                                          stderr=subprocess.STDOUT, text=True, start_new_session=True)
                wait_healthy(f"http://127.0.0.1:{port}", server, timeout=300)
            else:
                done = subprocess.run(["bash", "-ec", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                                      timeout=300)
                assert done.returncode == 0, done.stdout + done.stderr
                outputs.append(done.stdout)
    finally:
        if server is not None:
            os.killpg(server.pid, signal.SIGTERM)
            server.communicate(timeout=60)
    assert "reply:" in outputs[-1] and "generated (loss mask 1), reward 1.0" in outputs[-1], outputs
