"""What can go wrong in a run, split by what happens next.

::

    AgentError            one episode failed (the agent raised, timed out, made no LLM call,
                          or the gateway refused it): the episode is dropped and counted
    RunError              the run cannot go on: the CLI prints the message (which names the
                          culprit) and exits non-zero
    ├── AgentContractError    the agent is not an agent, or returned something that is not
    │                         a finite reward (a bug to fix, not bad luck)
    └── TooManyFailures       max_consecutive_failures episodes failed in a row (e.g. all of
                              the first ones); carries the first failure's traceback
"""

from __future__ import annotations


class AgentError(Exception):
    """One episode failed; ``details`` holds the full traceback (or the child's) when there is one."""

    def __init__(self, message: str, *, details: str | None = None) -> None:
        super().__init__(message)
        self.details = details


class RunError(Exception):
    """A run cannot go on; the message says why and names the culprit."""


class AgentContractError(RunError):
    """The agent does not satisfy the contract (docs/training.md, "The agent contract")."""


class TooManyFailures(RunError):
    """Too many episodes failed in a row."""
