"""Which waiting requests join the batch: fair across sessions.

First come, first served let one session key fill the whole batch: another session's request
went from 0.48 s to 6.6 s behind it (issue 15). Admission here is per session:

* a session holds at most ``max_rows_per_session`` rows of the batch (default: half of it), so
  a burst from one key always leaves rows for the others;
* free rows go round-robin: each time, to the oldest waiting request of the session that holds
  the fewest rows (ties: the session whose request waited longest).

Requests without a session id (direct engine use: benchmarks, colocated training) each count
as a session of their own. The cost is O(waiting + admitted x log sessions) per step.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Iterable

from rlgate.engine.local.batch import RequestState


def session_key(req: RequestState) -> object:
    return req.session_id if req.session_id is not None else id(req)


def admit_fairly(
    pending: deque[RequestState],
    running: Iterable[RequestState],
    free: int,
    max_rows_per_session: int,
    prefill_token_budget: int,
) -> list[RequestState]:
    """Pick up to ``free`` requests from ``pending`` (removing them, and aborted ones, from it).

    ``running`` are the batch's rows; at least one request is admitted when a row is free and
    some session is under its cap, however long its prompt."""
    held: dict[object, int] = {}
    for r in running:
        if not r.done:
            held[session_key(r)] = held.get(session_key(r), 0) + 1
    queues: dict[object, deque[RequestState]] = {}
    first_seen: dict[object, int] = {}
    for i, r in enumerate(pending):
        if r.aborted:
            continue
        k = session_key(r)
        if k not in queues:
            queues[k] = deque()
            first_seen[k] = i
        queues[k].append(r)
    heap = [(held.get(k, 0), first_seen[k], k) for k in queues if held.get(k, 0) < max_rows_per_session]
    heapq.heapify(heap)
    admitted: list[RequestState] = []
    longest = 0
    while heap and len(admitted) < free:
        n, seen, k = heapq.heappop(heap)
        req = queues[k][0]
        longest_if_added = max(longest, len(req.input_ids) + req.num_generated)  # a retracted row: its prefix too
        if admitted and longest_if_added * (len(admitted) + 1) > prefill_token_budget:
            break
        queues[k].popleft()
        admitted.append(req)
        longest = longest_if_added
        if queues[k] and n + 1 < max_rows_per_session:
            heapq.heappush(heap, (n + 1, seen, k))
    if admitted or len(pending) != sum(len(q) for q in queues.values()):
        taken = {id(r) for r in admitted}
        kept = [r for r in pending if not r.aborted and id(r) not in taken]
        pending.clear()
        pending.extend(kept)
    return admitted
