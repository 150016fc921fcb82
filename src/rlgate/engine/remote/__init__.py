"""Remote engines: inference servers (SGLang, vLLM) driven over HTTP, token-in/token-out.

Imports httpx only (no torch): a gateway that drives SGLang or vLLM servers never loads a
model. One concept per module:

* ``engine``   :class:`RemoteEngine`: generation, event validation, version tagging, errors;
* ``pool``     :class:`BackendPool`: connections, session affinity, failover;
* ``weights``  :class:`BackendWeights`: weight updates with rollback, health checks, rejoining;
* ``wire``     server-sent events and token checks; ``errors`` backend failures;
* ``backend``  :class:`Backend` (one server) and :class:`BackendHooks` (a server kind's
  weight protocol);
* ``sglang`` / ``vllm``  the two server kinds (request body, event parsing, weight protocol);
* ``options``  their ``rlgate serve`` options; ``factory`` builds the engine they describe.

See docs/remote-engines.md for the wire formats and the failure model.
"""

from __future__ import annotations

from rlgate.engine.remote.backend import Backend, BackendHooks, BackendState
from rlgate.engine.remote.engine import RemoteEngine
from rlgate.engine.remote.errors import BackendRejected, BackendUnreachable, LoadRefused, MalformedResponse
from rlgate.engine.remote.pool import BackendPool, Failover
from rlgate.engine.remote.sglang import SGLangEngine
from rlgate.engine.remote.vllm import VLLMEngine
from rlgate.engine.remote.weights import BackendWeights
from rlgate.engine.remote.wire import Chunk, StreamState

__all__ = [
    "Backend",
    "BackendHooks",
    "BackendPool",
    "BackendRejected",
    "BackendState",
    "BackendUnreachable",
    "BackendWeights",
    "Chunk",
    "Failover",
    "LoadRefused",
    "MalformedResponse",
    "RemoteEngine",
    "SGLangEngine",
    "StreamState",
    "VLLMEngine",
]
