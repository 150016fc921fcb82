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
