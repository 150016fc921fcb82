"""Issue 27's frictions of a training run, each pinned by a test that failed before its fix."""

from __future__ import annotations

import socket

import pytest

from rlgate.rollout.errors import RunError
from rlgate.train.gateway import check_port_free


def _port_in_time_wait() -> int:
    """A port whose last server closed its side of a connection first: that connection sits in
    TIME_WAIT (~60 s), as after a finished run whose gateway served agents."""
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    port = listener.getsockname()[1]
    client = socket.create_connection(("127.0.0.1", port))
    conn, _ = listener.accept()
    conn.close()  # the server closes first: its end goes to TIME_WAIT
    client.recv(1)  # sees the FIN
    client.close()
    listener.close()
    return port


def test_the_port_check_ignores_time_wait_but_not_a_listener():
    port = _port_in_time_wait()
    with socket.socket() as plain, pytest.raises(OSError):  # what the old check did: "in use"
        plain.bind(("127.0.0.1", port))
    check_port_free(port)  # uvicorn binds with SO_REUSEADDR: the port is free for it
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        with pytest.raises(RunError, match="is not available"):
            check_port_free(busy.getsockname()[1])


@pytest.mark.slow
def test_a_second_serve_never_replaces_the_key_of_the_running_gateway(tiny_model_dir, tmp_path):
    """Issue 27, friction 2: a second `rlgate serve` with the same --admin-key-file rewrote the file,
    then failed on the busy port: the running gateway's clients got 403."""
    import os
    import subprocess
    import sys

    from helpers import free_port, wait_healthy

    key_file = tmp_path / "admin.key"
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("RLGATE_STORE", "RLGATE_ADMIN_KEY")}

    def serve(p: int) -> list[str]:
        return [sys.executable, "-m", "rlgate.cli", "serve", "--model", str(tiny_model_dir), "--engine", "fake",
                "--store", ":memory:", "--port", str(p), "--admin-key-file", str(key_file)]

    first = subprocess.Popen(serve(port), env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        wait_healthy(f"http://127.0.0.1:{port}", first)
        key = key_file.read_text()
        for p, says in ((port, f"cannot serve on 127.0.0.1:{port}"), (free_port(), "running gateway")):
            r = subprocess.run(serve(p), env=env, capture_output=True, text=True, timeout=300)
            assert r.returncode != 0 and says in r.stderr, r.stdout + r.stderr
            assert "Traceback" not in r.stderr
            assert key_file.read_text() == key  # the running gateway's key is still on disk
        import httpx

        ok = httpx.get(f"http://127.0.0.1:{port}/rl/metrics", headers={"Authorization": f"Bearer {key.strip()}"})
        assert ok.status_code == 200
    finally:
        first.terminate()
        first.wait(60)
    # once it has stopped, the file is free for the next gateway
    from rlgate.cli import claim_key_file

    claim_key_file(key_file)
