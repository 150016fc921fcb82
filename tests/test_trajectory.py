"""Trajectory records: tree-aware discount, export styles, tensors, files."""

from __future__ import annotations

import math

import pytest

from rlgate.chat.conversation import Message
from rlgate.trajectory.export import (
    export_samples,
    read_jsonl,
    read_samples,
    to_packed_tensors,
    to_padded_tensors,
    write_jsonl,
    write_parquet,
)
from rlgate.trajectory.interaction import Interaction
from rlgate.trajectory.sample import Sample
from rlgate.trajectory.tree import discounted_rewards


def inter(iid, parent=None, reward=None, prompt=(1, 2), out=(3, 4), relation=None):
    i = Interaction(id=iid, session_id="s", api="chat", messages=[Message.of("user", iid)], tools=[],
                    prompt_ids=list(prompt), parent_id=parent,
                    relation=relation or ("extend" if parent else "root"))
    i.output_ids = list(out)
    i.output_logprobs = [-0.5] * len(out)
    i.output_versions = [7] * len(out)
    i.output_message = Message.of("assistant", "x")
    i.finish_reason = "stop"
    i.status = "completed"
    i.reward = reward
    return i


def test_chain_discount_matches_original():
    chain = [inter("a"), inter("b", "a"), inter("c", "b", reward=10)]
    r = discounted_rewards(chain, 0.9)
    assert r["a"] == pytest.approx(8.1) and r["b"] == pytest.approx(9.0) and r["c"] == 10
    # stored rewards untouched: discount again with another gamma
    r2 = discounted_rewards(chain, 0.5)
    assert r2["a"] == pytest.approx(2.5) and chain[0].reward is None


def test_chain_with_intermediate_rewards_is_return_to_go():
    chain = [inter("a", reward=1), inter("b", "a"), inter("c", "b", reward=10)]
    assert discounted_rewards(chain, 0.9)["a"] == pytest.approx(1 + 0.81 * 10)


def test_branching_tree_discount_hand_computed():
    #        a (r=1)
    #       /        \
    #   b (None)      d (r=2)
    #     |             |
    #   c (r=10)      e (None)
    #                 f: fork root, r=5 (not connected)
    nodes = [inter("a", reward=1), inter("b", "a"), inter("c", "b", reward=10), inter("d", "a", reward=2),
             inter("e", "d"), inter("f", reward=5, relation="fork")]
    r = discounted_rewards(nodes, 0.5)
    assert r["c"] == 10 and r["b"] == 5.0 and r["e"] is None and r["d"] == 2.0
    assert r["a"] == pytest.approx(1 + 0.5 * 5.0 + 0.5 * 2.0)  # each branch passes its value up
    assert r["f"] == 5


def _turn(iid, messages, reply, parent=None, reward=None, fork_reason=None):
    i = inter(iid, parent, reward, relation="extend" if parent else ("fork" if fork_reason else "root"))
    i.messages, i.output_message, i.fork_reason = messages, Message.of("assistant", reply), fork_reason
    return i


def test_a_fork_stays_in_its_conversation_and_passes_rewards_back():
    """Lineage by messages: a turn that forked (other tools, an unbridgeable template) continues the
    turn whose messages + reply its messages extend; a side request is a conversation of its own."""
    sys_, q1, q2, q3 = (Message.of("system", "S"), Message.of("user", "q1"), Message.of("user", "q2"),
                        Message.of("user", "q3"))
    a1, b1 = Message.of("assistant", "A1", reasoning="dropped by the client"), Message.of("assistant", "B1")
    a = _turn("a", [sys_, q1], "A1")
    b = _turn("b", [sys_, q1, a1, q2], "B1", parent="a")
    c = _turn("c", [sys_, q1, a1, q2, b1, q3], "C1", reward=10, fork_reason="no_prefix_match")
    d = _turn("d", [Message.of("user", "title?")], "T", fork_reason="no_prefix_match")
    e = _turn("e", [sys_, q1], "A1 again", reward=1, fork_reason="no_prefix_match")  # a retry of turn 1
    samples, stats = export_samples([a, b, c, d, e], style="concat", discount=0.5)
    by_leaf = {s.id: s for s in samples}
    assert stats["fork"] == 3 and stats["conversations"] == 3
    assert by_leaf["b"].turn_rewards == [pytest.approx(2.5), pytest.approx(5.0)]  # c's 10 crossed the fork
    assert by_leaf["b"].conversation_id == by_leaf["c"].conversation_id == "a"
    assert by_leaf["c"].fork_reason == "no_prefix_match" and by_leaf["c"].lineage_parent_id == "b"
    assert by_leaf["c"].parent_id is None and by_leaf["c"].chain == ["c"]
    assert by_leaf["d"].conversation_id == "d" and by_leaf["d"].lineage_parent_id is None
    assert by_leaf["e"].conversation_id == "e"  # nothing before turn 1: a new conversation
    assert by_leaf["b"].fork_reason is None and by_leaf["b"].lineage_parent_id is None
    individual, _ = export_samples([a, b, c, d, e], style="individual", discount=0.5)
    assert {s.id: s.lineage_parent_id for s in individual} == {"a": None, "b": "a", "c": "b", "d": None,
                                                                   "e": None}
    assert [s.reward for s in individual] == [pytest.approx(2.5), pytest.approx(5.0), 10, None, 1]


def test_unrewarded_tree_stays_none():
    r = discounted_rewards([inter("a"), inter("b", "a")], 0.9)
    assert r == {"a": None, "b": None}


def test_concat_export_masks_each_generated_segment():
    a = inter("a", prompt=[1, 2], out=[3, 4])
    b = inter("b", "a", prompt=[1, 2, 3, 4, 5], out=[6, 7], reward=1.0)
    b.output_versions = [8, 8]
    samples, stats = export_samples([a, b], style="concat")
    (s,) = samples
    assert s.chain == ["a", "b"] and s.id == "b"
    assert s.input_ids == [1, 2, 3, 4, 5, 6, 7]
    assert s.loss_mask == [0, 0, 1, 1, 0, 1, 1]
    assert s.versions == [-1, -1, 7, 7, -1, 8, 8]
    assert s.logprobs == [0.0, 0.0, -0.5, -0.5, 0.0, -0.5, -0.5]
    assert s.reward == 1.0 and s.turn_rewards == [1.0, 1.0]
    assert stats["unaligned_turns"] == 0 and stats["extend"] == 1 and stats["root"] == 1


def test_concat_unaligned_turn_gets_no_loss():
    a = inter("a", prompt=[1, 2], out=[3, 4])
    b = inter("b", "a", prompt=[1, 2, 9, 4, 5], out=[6])  # re-rendered: 3 became 9
    (s,), stats = export_samples([a, b], style="concat")
    assert s.loss_mask == [0, 0, 0, 0, 0, 1] and stats["unaligned_turns"] == 1


def test_failed_and_pending_are_counted_not_exported():
    a = inter("a")
    f = inter("f")
    f.status = "failed"
    p = inter("p")
    p.status = "pending"
    samples, stats = export_samples([a, f, p])
    assert [s.id for s in samples] == ["a"] and stats["failed"] == 1 and stats["pending"] == 1


@pytest.mark.torch
def test_padded_and_packed_tensors():
    torch = pytest.importorskip("torch")
    samples, _ = export_samples([inter("a", prompt=[5, 6, 7], out=[8], reward=2.0),
                                 inter("b", prompt=[1], out=[2, 3])])
    t = to_padded_tensors(samples, pad_token_id=0)
    assert t["input_ids"].tolist() == [[5, 6, 7, 8], [1, 2, 3, 0]]
    assert t["attention_mask"].tolist() == [[True] * 4, [True, True, True, False]]
    assert t["loss_mask"].tolist() == [[False, False, False, True], [False, True, True, False]]
    assert t["versions"].tolist() == [[-1, -1, -1, 7], [-1, 7, 7, -1]]
    assert t["rewards"][0].item() == 2.0 and math.isnan(t["rewards"][1].item())
    p = to_packed_tensors(samples)
    assert p["input_ids"].tolist() == [5, 6, 7, 8, 1, 2, 3]
    assert p["position_ids"].tolist() == [0, 1, 2, 3, 0, 1, 2]
    assert p["cu_seqlens"].tolist() == [0, 4, 7] and p["cu_seqlens"].dtype == torch.int32
    assert p["max_seqlen"] == 4
    assert p["loss_mask"].tolist() == [False, False, False, True, False, True, True]


def test_jsonl_and_parquet_roundtrip(tmp_path):
    import datasets

    a = inter("a", reward=1.5)
    b = inter("b", "a", prompt=[1, 2, 3, 4, 9], out=[10, 11])
    samples, _ = export_samples([a, b], style="concat", task_id="task-7")
    samples += export_samples([a, b], style="individual", task_id="task-7")[0]
    for k, s in enumerate(samples):
        s.group_id, s.episode, s.step = "g-1", k, 3
    assert read_samples(write_jsonl(samples, tmp_path / "s.jsonl")) == samples
    assert read_jsonl(tmp_path / "s.jsonl") == [s.to_dict() for s in samples]
    write_parquet(samples, tmp_path / "s.parquet")
    assert read_samples(tmp_path / "s.parquet") == samples
    ds = datasets.load_dataset("parquet", data_files=str(tmp_path / "s.parquet"), split="train")
    assert len(ds) == len(samples)
    for row, s in zip(ds, samples, strict=True):
        assert row["input_ids"] == s.input_ids
        assert row["loss_mask"] == s.loss_mask
        assert row["versions"] == s.versions
        assert row["logprobs"] == pytest.approx(s.logprobs)
        assert row["reward"] == s.reward or (row["reward"] is None and s.reward is None)
        assert row["id"] == s.id
        # the columns a viewer groups by
        assert (row["session_id"], row["task_id"], row["group_id"], row["step"]) == ("s", "task-7", "g-1", 3)
        assert row["episode"] == s.episode


def test_sample_wire_form_and_validation():
    (s,), _ = export_samples([inter("a", reward=1.0)], task_id="t")
    d = s.to_dict()
    assert d["session_id"] == "s" and d["task_id"] == "t"
    assert "chain" not in d and "group_id" not in d  # concat-only / rollout fields left out while unset
    # a field this version does not know is kept, not lost
    again = Sample.from_dict({**d, "from_the_future": 1})
    assert again.extra == {"from_the_future": 1} and again.to_dict()["from_the_future"] == 1
    assert s.generated_tokens == 2 and s.min_version == 7 and s.temperature == 1.0
    with pytest.raises(ValueError, match="differ in length"):
        Sample.from_dict({**d, "loss_mask": [0]})
