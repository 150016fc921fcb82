"""Run an app on 127.0.0.1 in the background (tests, demo, benchmarks)."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import uvicorn

from rlgate.server.serve import uvicorn_config


class ServerThread:
    """``with ServerThread(app) as url:`` serves ``app`` from its own thread and event loop.

    ``port=0`` picks a free ephemeral port; ``url`` is ``http://127.0.0.1:PORT``.
    """

    def __init__(self, app: Any, host: str = "127.0.0.1", port: int = 0, log_level: str = "warning",
                 timeout_keep_alive: int = 5) -> None:
        self.config = uvicorn_config(app, host=host, port=port, log_level=log_level, shutdown_timeout=10,
                                     timeout_keep_alive=timeout_keep_alive)
        self.server = uvicorn.Server(self.config)
        self.thread = threading.Thread(target=self._run, name="rlgate-server", daemon=True)
        self.url = ""
        self.loop: asyncio.AbstractEventLoop | None = None  # the server's event loop, once serving
        self._error: BaseException | None = None

    def _run(self) -> None:
        try:
            asyncio.run(self._serve())
        except BaseException as exc:  # noqa: BLE001 - surfaced in start()
            self._error = exc

    async def _serve(self) -> None:
        self.loop = asyncio.get_running_loop()
        await self.server.serve()

    def start(self) -> str:
        self.thread.start()
        while not self.server.started:
            if not self.thread.is_alive():
                raise RuntimeError(f"server failed to start: {self._error!r}")
            self.thread.join(0.01)
        sock = self.server.servers[0].sockets[0]
        host, port = sock.getsockname()[:2]
        self.url = f"http://{host}:{port}"
        return self.url

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(30)

    def __enter__(self) -> str:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()
