"""Python client for the gateway's control routes.

::

    client = GatewayClient("http://127.0.0.1:8000", admin_key)
    async with client.session("task-1") as s:
        oai = AsyncOpenAI(base_url=s.base_url, api_key=s.api_key)
        ...                                   # the agent talks to the gateway
        await s.set_reward(1.0)               # rewards the last interaction
    batch = await s.export(discount=0.9, style="concat")

    s = await client.start_session("task-2")
    ...                                       # the agent talks to the gateway
    batch = await s.finish(1.0)               # end + reward + export in one call

A client made with ``policy="name"`` (docs/policies.md) binds every session it starts to that policy
and pushes weights to it (its adapter directory, ``update_weights``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Any

import httpx

from rlgate.trajectory.export import DEFAULT_EXPORT_STYLE, NO_DISCOUNT

log = logging.getLogger("rlgate.client")

# A dropped connection (issue 25: one end_session in ~700 failed with httpx.ReadError) is retried
# this many times, after these pauses: for every call when the request was never sent (no
# connection), and for idempotent calls (health, metrics, end_session, set_reward, an export
# that keeps the session) also when the answer was lost.
RETRY_PAUSES_S = (0.05, 0.25, 1.0)


class GatewayClientError(Exception):
    def __init__(self, status: int, body: Any, route: str) -> None:
        msg = body.get("error", {}).get("message") if isinstance(body, dict) else None
        super().__init__(f"{route} -> HTTP {status}: {msg or body}")
        self.status = status
        self.body = body
        self.route = route


class SessionHandle:
    """One RL episode: its id, its API key and the URLs the agent should use."""

    def __init__(self, client: GatewayClient, session_id: str, api_key: str) -> None:
        self._client = client
        self.session_id = session_id
        self.api_key = api_key
        self.ended = False

    @property
    def base_url(self) -> str:
        """For the OpenAI SDK (``.../v1``)."""
        return self._client.base_url + "/v1"

    @property
    def anthropic_base_url(self) -> str:
        """For the Anthropic SDK (it appends ``/v1/messages`` itself)."""
        return self._client.base_url

    async def set_reward(self, reward: float, interaction_id: str | None = None) -> dict[str, Any]:
        body: dict[str, Any] = {"reward": reward}
        if interaction_id is not None:
            body["interaction_id"] = interaction_id
        if self.ended:  # the session key no longer rewards an ended session; the admin key does
            body["session_id"] = self.session_id
            return await self._client._post("/rl/set_reward", body, idempotent=True)
        return await self._client._post("/rl/set_reward", body, key=self.api_key, idempotent=True)

    async def end(self) -> int:
        if self.ended:
            return -1
        out = await self._client._post("/rl/end_session", {}, key=self.api_key, idempotent=True)
        self.ended = True
        return int(out["interaction_count"])

    async def finish(
        self, reward: float | dict[str, float] | None = None, *, discount: float = NO_DISCOUNT, style: str = DEFAULT_EXPORT_STYLE,
        wait_timeout: float = 0.0,
    ) -> dict[str, Any]:
        """End, reward and export in one call (``POST /rl/finish_session``, admin key): ``reward`` is a
        float for the last completed interaction, or ``{interaction_id: reward}``. Returns the export;
        the session is gone afterwards."""
        out = await self._client.finish_session(self.session_id, reward, discount=discount, style=style,
                                                wait_timeout=wait_timeout)
        self.ended = True
        return out

    async def export(
        self, *, discount: float = NO_DISCOUNT, style: str = DEFAULT_EXPORT_STYLE, keep: bool = False, wait_timeout: float = 0.0
    ) -> dict[str, Any]:
        return await self._client.export(self.session_id, discount=discount, style=style, keep=keep,
                                         wait_timeout=wait_timeout)


class GatewayClient:
    def __init__(
        self, base_url: str, admin_key: str, *, timeout: float = 600.0, http_client: httpx.AsyncClient | None = None,
        policy: str | None = None,
    ) -> None:
        self.policy = policy  # sessions started are bound to it; update_weights pushes its adapter
        self.base_url = base_url.rstrip("/")
        if self.base_url.endswith("/v1"):
            self.base_url = self.base_url[:-3]
        self.admin_key = admin_key
        self._own = http_client is None
        self._http = http_client or httpx.AsyncClient(timeout=timeout)

    async def _request(self, method: str, route: str, body: Any = None, *, key: str | None = None,
                       idempotent: bool = False) -> Any:
        headers = {"Authorization": f"Bearer {key or self.admin_key}"}
        for attempt in range(len(RETRY_PAUSES_S) + 1):
            try:
                r = await self._http.request(method, self.base_url + route, json=body, headers=headers)
                break
            except httpx.TransportError as exc:
                sent = not isinstance(exc, httpx.ConnectError | httpx.ConnectTimeout | httpx.PoolTimeout)
                if attempt == len(RETRY_PAUSES_S) or (sent and not idempotent):
                    raise
                log.warning("%s %s: %s; retrying", method, route, type(exc).__name__)
                await asyncio.sleep(RETRY_PAUSES_S[attempt])
        try:
            data = r.json()
        except ValueError:
            data = r.text
        if r.status_code >= 400:
            raise GatewayClientError(r.status_code, data, route)
        return data

    async def _post(self, route: str, body: Any, *, key: str | None = None, idempotent: bool = False) -> Any:
        return await self._request("POST", route, body, key=key, idempotent=idempotent)

    async def health(self) -> dict[str, Any]:
        return await self._request("GET", "/health", idempotent=True)

    async def metrics(self) -> dict[str, Any]:
        return await self._request("GET", "/rl/metrics", idempotent=True)

    async def grant_capacity(self, count: int = 1) -> int:
        """Admit ``count`` more sessions (gateway in ``granted`` capacity mode)."""
        return int((await self._post("/grant_capacity", {"count": count}))["capacity"])

    async def start_session(
        self, task_id: str, *, api_key: str | None = None, mode: str | None = None,
        metadata: dict[str, Any] | None = None,
    ) -> SessionHandle:
        body: dict[str, Any] = {"task_id": task_id}
        if api_key is not None:
            body["api_key"] = api_key
        if mode is not None:
            body["mode"] = mode
        if metadata is not None:
            body["metadata"] = metadata
        if self.policy is not None:
            body["policy"] = self.policy
        out = await self._post("/rl/start_session", body)
        return SessionHandle(self, out["session_id"], out["api_key"])

    async def start_sessions(self, task_ids: list[str]) -> list[SessionHandle | GatewayClientError]:
        """``POST /rl/start_sessions``: a session per task id, in one call. Each item is the session,
        or the error the single call would have raised for that one (e.g. 429 ``no_capacity``)."""
        bind = {"policy": self.policy} if self.policy is not None else {}
        out = await self._post("/rl/start_sessions", {"sessions": [{"task_id": t, **bind} for t in task_ids]})
        return [SessionHandle(self, item["session_id"], item["api_key"]) if "session_id" in item
                else GatewayClientError(int(item["status"]), {"error": item["error"]}, "/rl/start_sessions")
                for item in out["sessions"]]

    @contextlib.asynccontextmanager
    async def session(self, task_id: str, **kw: Any) -> AsyncIterator[SessionHandle]:
        """Start a session; end it when the block exits (also on error)."""
        s = await self.start_session(task_id, **kw)
        try:
            yield s
        finally:
            await s.end()

    async def export(
        self, session_id: str, *, discount: float = NO_DISCOUNT, style: str = DEFAULT_EXPORT_STYLE, keep: bool = False,
        wait_timeout: float = 0.0,
    ) -> dict[str, Any]:
        return await self._post("/export_trajectories", {
            "session_id": session_id, "discount": discount, "style": style, "keep": keep,
            "wait_timeout": wait_timeout,
        }, idempotent=keep)  # without keep, an export retires the session: a lost answer is not retried

    async def finish_session(
        self, session_id: str, reward: float | dict[str, float] | None = None, *, discount: float = NO_DISCOUNT,
        style: str = DEFAULT_EXPORT_STYLE, wait_timeout: float = 0.0,
    ) -> dict[str, Any]:
        """``POST /rl/finish_session``: end an active session, set its rewards (a float for the last
        completed interaction, or ``{interaction_id: reward}``) and return its export, all or nothing."""
        body: dict[str, Any] = {"session_id": session_id, "discount": discount, "style": style,
                                "wait_timeout": wait_timeout}
        if isinstance(reward, dict):
            body["rewards"] = reward
        elif reward is not None:
            body["reward"] = reward
        # it exports and retires the session: a lost answer is not retried (as an export without keep)
        return await self._post("/rl/finish_session", body)

    async def update_weights(self, path: str) -> int:
        """Load ``path`` (full weights; with ``policy``: that policy's adapter directory); the new version."""
        body = {"path": str(path), **({"policy": self.policy} if self.policy is not None else {})}
        return int((await self._post("/rl/update_weights", body))["version"])

    async def policies(self) -> dict[str, Any]:
        """``GET /rl/policies``: ``{"default", "max_policies", "policies": [{"name", "version", ...}]}``."""
        return await self._request("GET", "/rl/policies", idempotent=True)

    async def load_policy(self, name: str, path: str, *, version: int | None = None) -> int:
        """A new adapter policy from a LoRA adapter directory; its version."""
        body: dict[str, Any] = {"name": name, "path": str(path)}
        if version is not None:
            body["version"] = version
        return int((await self._post("/rl/policies", body))["version"])

    async def unload_policy(self, name: str) -> None:
        await self._post("/rl/policies/unload", {"name": name})

    async def version(self) -> int:
        """The weight version of ``policy`` (None: the default policy's)."""
        if self.policy is None:
            return int((await self.health())["version"])
        return int((await self.metrics())["policies"][self.policy])

    async def aclose(self) -> None:
        if self._own:
            await self._http.aclose()

    async def __aenter__(self) -> GatewayClient:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()
