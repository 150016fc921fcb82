"""rlgate as the rollout of trainers teams already run, and the shared episode player.

* ``integrations/trl.py`` — a ``rollout_func`` for TRL's ``GRPOTrainer``;
* ``integrations/verl.py`` — an agent loop for verl 0.9's ``AgentLoopManager``;
* ``integrations/episodes.py`` — what both do: one agent episode per item through a gateway
  session, one conversation chain back (docs/integrations.md).

Importing this package imports neither TRL nor verl.
"""
