"""rlgate.online: serving real traffic and learning from it (``rlgate serve --online``; docs/online.md).

Part 1 (serving): tenants and their keys (``records/tenants.py``), conversations recognised from a header or
by token-exact parent matching (``conversations.py``), feedback of every kind (``records/feedback.py``,
``implicit.py``), its reward (``reward_map.py``), data rights (``rights.py``, ``retention.py``,
``redaction.py``) and the state that binds them to one gateway (``service.py``). Part 2 (learning):
live GRPO groups, the continuous trainer, the canary (``groups.py``, ``trainer.py``, ``canary.py``,
``versions.py``, ``options.py``) and the simulated users (``simulation.py``).

The contract between the two parts (kept stable; docs/online.md repeats it):

* ``records/feedback.py``: the frozen dataclass :class:`~rlgate.records.feedback.FeedbackEvent`
  (``id``, ``tenant``, ``conversation_id``, ``interaction_id`` - None for a conversation-level event -,
  ``kind`` "thumbs" | "rating" | "preference" | "comment" | "outcome" | "implicit", ``value``,
  ``source`` "explicit" | "implicit" | "delayed", ``created_at``, ``policy_version``, ``metadata``).
  The store keeps them (``store/online.py``: ``add_feedback(event) -> write seq``,
  ``list_feedback(tenant=, conversation_id=, interaction_id=, after=cursor, limit=) -> FeedbackPage``
  with ``.events`` and ``.cursor``: pass the cursor back as ``after`` to tail new events).
* ``online/reward_map.py``: ``RewardMap.from_config(OnlineConfig)``;
  ``RewardMap.reward(events) -> float | None`` for a turn's or a conversation's events (None: no
  signal yet).
* ``online/rights.py``: ``DeletionNotifier.on_delete(callback)``; the callback gets a
  :class:`~rlgate.online.rights.Deletion` (tenant, conversation ids, session ids, interaction ids)
  after the data left the store, and must drop anything it holds of them (pending batches). The
  gateway's notifier is ``app.state.online.rights.notifier``.
* ``POST /v1/feedback`` (a tenant key or the admin key; JSON body validated by Pydantic; 4xx in
  the OpenAI error shape): ``api/online/``.

Layers (``tests/test_layers.py``): the feedback and tenant records the store persists are
``rlgate.records`` (rank 3.5, below ``store``); ``online`` sits between ``core`` and ``api`` (6.5).
"""
