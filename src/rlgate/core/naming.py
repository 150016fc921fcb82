"""How a gateway names what it creates: session keys and session ids.

A single gateway uses :class:`DefaultNaming` (random keys, ids ``{task_id}-{k}``). Gateway
replicas behind a router (``rlgate.cluster``) use a naming whose keys and ids name the
replica, so that a stateless router sends every request of a session to the same replica.
"""

from __future__ import annotations

import secrets
from typing import Protocol


class SessionNaming(Protocol):
    def new_key(self) -> str:
        """A fresh session API key (a secret: never logged)."""
        ...

    def session_id(self, base: str) -> str:
        """The id of a new session whose plain id would be ``base`` (``{task_id}-{k}``)."""
        ...


class DefaultNaming:
    def new_key(self) -> str:
        return secrets.token_urlsafe(32)

    def session_id(self, base: str) -> str:
        return base
