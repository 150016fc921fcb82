"""Trajectory records: tree-aware discount, export styles, tensors, files."""

from __future__ import annotations

import math

import pytest
import torch

from rlgate.chat.conversation import Message
from rlgate.trajectory.export import (
    export_samples,
    read_jsonl,
    to_packed_tensors,
    to_padded_tensors,
    write_jsonl,
    write_parquet,
)
from rlgate.trajectory.interaction import Interaction
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


def test_unrewarded_tree_stays_none():
    r = discounted_rewards([inter("a"), inter("b", "a")], 0.9)
    assert r == {"a": None, "b": None}


def test_concat_export_masks_each_generated_segment():
    a = inter("a", prompt=[1, 2], out=[3, 4])
    b = inter("b", "a", prompt=[1, 2, 3, 4, 5], out=[6, 7], reward=1.0)
    b.output_versions = [8, 8]
    samples, stats = export_samples([a, b], style="concat")
    (s,) = samples
    assert s["chain"] == ["a", "b"] and s["id"] == "b"
    assert s["input_ids"] == [1, 2, 3, 4, 5, 6, 7]
    assert s["loss_mask"] == [0, 0, 1, 1, 0, 1, 1]
    assert s["versions"] == [-1, -1, 7, 7, -1, 8, 8]
    assert s["logprobs"] == [0.0, 0.0, -0.5, -0.5, 0.0, -0.5, -0.5]
    assert s["reward"] == 1.0 and s["turn_rewards"] == [1.0, 1.0]
    assert stats["unaligned_turns"] == 0 and stats["extend"] == 1 and stats["root"] == 1


def test_concat_unaligned_turn_gets_no_loss():
    a = inter("a", prompt=[1, 2], out=[3, 4])
    b = inter("b", "a", prompt=[1, 2, 9, 4, 5], out=[6])  # re-rendered: 3 became 9
    (s,), stats = export_samples([a, b], style="concat")
    assert s["loss_mask"] == [0, 0, 0, 0, 0, 1] and stats["unaligned_turns"] == 1


def test_failed_and_pending_are_counted_not_exported():
    a = inter("a")
    f = inter("f")
    f.status = "failed"
    p = inter("p")
    p.status = "pending"
    samples, stats = export_samples([a, f, p])
    assert [s["id"] for s in samples] == ["a"] and stats["failed"] == 1 and stats["pending"] == 1


def test_padded_and_packed_tensors():
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
    samples, _ = export_samples([a, b], style="concat")
    samples += export_samples([a, b], style="individual")[0]
    assert read_jsonl(write_jsonl(samples, tmp_path / "s.jsonl")) == samples
    write_parquet(samples, tmp_path / "s.parquet")
    ds = datasets.load_dataset("parquet", data_files=str(tmp_path / "s.parquet"), split="train")
    assert len(ds) == len(samples)
    for row, s in zip(ds, samples, strict=False):
        assert row["input_ids"] == s["input_ids"]
        assert row["loss_mask"] == s["loss_mask"]
        assert row["versions"] == s["versions"]
        assert row["logprobs"] == pytest.approx(s["logprobs"])
        assert row["reward"] == s["reward"] or (row["reward"] is None and s["reward"] is None)
        assert row["id"] == s["id"]
