"""Built-in reward functions for ``reward:`` in a training config (docs/training.md §1).

* :mod:`rlgate.rewards.judge` — an LLM judge: a model behind any OpenAI-compatible endpoint
  scores an episode's trajectory (or a GRPO group's, side by side) against a rubric.
"""

from rlgate.rewards.judge import Judge, JudgeError

__all__ = ["Judge", "JudgeError"]
