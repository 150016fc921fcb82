"""Session keys and session ids that name their replica, so routing needs no shared state.

Key format (``rk1``, 72 characters)::

    rk1.<replica>.<nonce>.<tag>

* ``replica``: the replica's index (decimal, 0 ... N-1);
* ``nonce``: 32 random bytes, base64url (the secret part: 256 bits);
* ``tag``: the first 16 bytes of ``HMAC-SHA256(routing_secret, "rk1.<replica>.<nonce>")``,
  base64url.

Any router that knows the routing secret reads the replica from the key and checks the tag
in constant time (``hmac.compare_digest``) before it forwards anything, so a key cannot be
forged to steer traffic to a replica of the client's choice, and garbage keys are refused
(401) without touching a replica. The replica itself still authenticates the key as
usual (its SHA-256 digest must belong to one of its sessions). The routing secret is
derived from the admin key unless one is given (``HMAC-SHA256(admin_key, "rlgate routing
v1")``): whoever holds the admin key can run a router, nobody else can mint keys.

Keys a client chose itself (``start_session`` with ``api_key``) carry no replica: the
router maps them to a replica with rendezvous hashing over the replica indices (the
same answer on every router, for as long as the number of replicas is the same).

Session ids get the prefix ``r<replica>.`` (``r2.math-17-0``): admin routes that name a
session (``/export_trajectories``, ``/rl/set_reward`` with ``session_id``) go to that
replica. They need the admin key anyway, so the id carries no tag.

Keys are secrets: nothing here logs them, and ``repr`` of the naming shows no secret.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import re
import secrets

KEY_PREFIX = "rk1"
_NONCE_BYTES = 32
_TAG_BYTES = 16
_SESSION_ID = re.compile(r"r(\d{1,6})\.")


def derive_routing_secret(admin_key: str) -> bytes:
    return hmac.new(admin_key.encode("utf-8"), b"rlgate routing v1", hashlib.sha256).digest()


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")


def _tag(secret: bytes, body: str) -> str:
    return _b64(hmac.new(secret, body.encode("ascii"), hashlib.sha256).digest()[:_TAG_BYTES])


def mint_key(secret: bytes, replica: int) -> str:
    body = f"{KEY_PREFIX}.{replica}.{_b64(secrets.token_bytes(_NONCE_BYTES))}"
    return f"{body}.{_tag(secret, body)}"


def key_replica(secret: bytes, key: str) -> int | None:
    """The replica a minted key names, or None if it is not a well-formed, authentic key."""
    parts = key.split(".")
    if len(parts) != 4 or parts[0] != KEY_PREFIX or not parts[1].isdigit() or len(parts[1]) > 6:
        return None
    body, _, tag = key.rpartition(".")
    try:
        expected = _tag(secret, body)
    except UnicodeEncodeError:
        return None
    if not hmac.compare_digest(expected.encode("ascii"), tag.encode("utf-8", "replace")):
        return None
    return int(parts[1])


def is_minted(key: str) -> bool:
    """Looks like a minted key (whether or not authentic)."""
    return key.startswith(KEY_PREFIX + ".")


def hashed_replica(key: str, replicas: int) -> int:
    """Rendezvous hashing of a key chosen by a client onto ``replicas`` replicas."""
    return max(range(replicas), key=lambda i: hashlib.sha256(f"{i}\x00{key}".encode("utf-8", "replace")).digest())


def session_id_replica(session_id: str) -> int | None:
    m = _SESSION_ID.match(session_id)
    return int(m.group(1)) if m else None


class ReplicaNaming:
    """The :class:`~rlgate.core.naming.SessionNaming` of replica ``index``."""

    def __init__(self, index: int, secret: bytes) -> None:
        self.index = index
        self._secret = secret

    def new_key(self) -> str:
        return mint_key(self._secret, self.index)

    def session_id(self, base: str) -> str:
        return f"r{self.index}.{base}"

    def __repr__(self) -> str:
        return f"ReplicaNaming(index={self.index})"
