"""A checkpoint put on trial as the canary, for the online proofs (``demo/online.py``, ``demo/online_real.py``).

Both proofs push a deliberately bad checkpoint through ``POST /rl/update_weights`` (it becomes the
canary) and serve simulated users until the canary decides on it, or until a budget of conversations
is spent: the proof then reports whether, and how fast, the canary rolled it back.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import httpx

from rlgate.online.canary import Canary


class Users(Protocol):
    """Simulated users (``online/simulation.py``, ``demo/number_users.py``)."""

    conversations: int

    async def run(self, n: int, *, concurrency: int) -> Any:
        ...


@dataclass
class Trial:
    version: int  # the checkpoint's weight version
    conversations: int  # served while it was on trial
    decision: dict[str, Any] | None  # the canary's promote / rollback, None if undecided within the budget


async def put_on_trial(http: httpx.AsyncClient, canary: Canary, users: Users, path: Path, *, concurrency: int,
                       max_conversations: int, log: Callable[[str], None], what: str = "bad checkpoint") -> Trial:
    """Push ``path`` (the spare slot must be free: ``TwoSlotEngine.can_load``) and serve ``users`` 16
    conversations at a time until the canary decides on it or ``max_conversations`` were served."""
    r = await http.post("/rl/update_weights", json={"path": str(path)})
    r.raise_for_status()
    version = int(r.json()["version"])
    log(f"{what} pushed as version {version} (canary share {canary.options.canary_share:.0%})")
    n0 = users.conversations
    while canary.canary_version == version and users.conversations - n0 < max_conversations:
        await users.run(16, concurrency=concurrency)
    decided = [d for d in canary.decisions if d.version == version and d.action in ("promote", "rollback")]
    return Trial(version, users.conversations - n0, decided[-1].to_dict() if decided else None)
