"""``rlgate export --format trl | verl | openrlhf | jsonl``: the columns, the masks, and each file
loaded back by the library that reads it (skipped, with the reason, where that library does not import: OpenRLHF
needs CUDA builds). The verl export is read by verl 0.9.1 in its own venv: tests/test_integrations_verl.py."""

from __future__ import annotations

import json

import pytest

from rlgate.chat.conversation import Message, ToolCall
from rlgate.cli import main
from rlgate.trajectory.export import export_samples, write_jsonl, write_parquet
from rlgate.trajectory.formats import SCHEMA_VERSIONS, format_rows, write_format
from rlgate.trajectory.interaction import Interaction


def _turn(iid, messages, prompt, out, reply, parent=None, reward=None):
    i = Interaction(id=iid, session_id="sess", api="chat", messages=messages, tools=[], prompt_ids=list(prompt),
                    parent_id=parent, relation="extend" if parent else "root")
    i.output_ids = list(out)
    i.output_logprobs = [-0.25 * (k + 1) for k in range(len(out))]
    i.output_versions = [3] * len(out)
    i.output_message = reply
    i.finish_reason = "tool_calls" if reply.tool_calls else "stop"
    i.status = "completed"
    i.reward = reward
    return i


def two_turns() -> list[Interaction]:
    """A tool call, its result, the answer: prompt [1 2], call [3 4], result [5 6], answer [7 8]."""
    user = Message.of("user", "2 + 3?")
    call = Message(role="assistant", tool_calls=[ToolCall("call_1", "add", '{"a": 2, "b": 3}')])
    result = Message.of("tool", "5", tool_call_id="call_1")
    a = _turn("a", [user], [1, 2], [3, 4], call)
    b = _turn("b", [user, call, result], [1, 2, 3, 4, 5, 6], [7, 8], Message.of("assistant", "5"), parent="a",
              reward=1.0)
    return [a, b]


@pytest.fixture
def chain():
    samples, _ = export_samples(two_turns(), style="concat")
    return samples


def test_every_format_cuts_the_chain_at_its_first_generated_token(chain):
    for fmt in ("trl", "verl", "openrlhf"):
        (row,), skipped = format_rows(chain, fmt)
        assert skipped == 0 and row["schema_version"] == SCHEMA_VERSIONS[fmt] == f"rlgate.{fmt}/1"
        assert row["prompt_ids"] == [1, 2] and row["response_ids"] == [3, 4, 5, 6, 7, 8]
        assert row["response_mask"] == [1, 1, 0, 0, 1, 1]  # the tool result is not the model's
        assert row["response_logprobs"] == [-0.25, -0.5, 0.0, 0.0, -0.25, -0.5]
        assert row["response_versions"] == [3, 3, -1, -1, 3, 3]
        assert row["chain"] == ["a", "b"] and row["id"] == "b" and row["session_id"] == "sess"
    (trl,), _ = format_rows(chain, "trl")
    assert trl["input_ids"] == [1, 2, 3, 4, 5, 6, 7, 8] and trl["assistant_masks"] == [0, 0, 1, 1, 0, 0, 1, 1]
    assert [m["role"] for m in trl["prompt"]] == ["user"]
    assert [m["role"] for m in trl["completion"]] == ["assistant", "tool", "assistant"]
    assert trl["completion"][0]["tool_calls"][0]["function"]["name"] == "add" and trl["reward"] == 1.0
    (verl,), _ = format_rows(chain, "verl")
    assert verl["data_source"] == "rlgate" and verl["extra_info"]["index"] == 0
    assert [m["role"] for m in verl["messages"]] == ["user", "assistant", "tool", "assistant"]
    (orl,), _ = format_rows(chain, "openrlhf")
    assert orl["input"] == trl["prompt"] and orl["output"] == trl["completion"]
    (plain,), _ = format_rows(chain, "jsonl")
    assert plain["schema_version"] == "rlgate.jsonl/1" and plain["loss_mask"] == trl["assistant_masks"]


def test_per_turn_rows_come_from_the_individual_export():
    samples, _ = export_samples(two_turns(), style="individual")
    rows, _ = format_rows(samples, "openrlhf")
    assert [r["id"] for r in rows] == ["a", "b"]
    assert rows[1]["prompt_ids"] == [1, 2, 3, 4, 5, 6] and rows[1]["response_mask"] == [1, 1]
    assert [m["role"] for m in rows[1]["input"]] == ["user"]  # the prompt: what preceded the first reply


def test_a_sample_without_generated_tokens_is_left_out_and_counted(chain):
    empty = chain[0].to_dict() | {"id": "e", "loss_mask": [0] * 8}
    rows, skipped = format_rows([empty, chain[0]], "verl")
    assert [r["id"] for r in rows] == ["b"] and skipped == 1
    with pytest.raises(ValueError, match="unknown export format 'nemo'"):
        format_rows(chain, "nemo")  # type: ignore[arg-type]


def test_cli_export_reads_parquet_dumps_and_jsonl(chain, tmp_path, capsys):
    write_parquet(chain, tmp_path / "step-000001.parquet")  # messages stored as JSON text there
    write_jsonl(chain, tmp_path / "more.jsonl")
    assert main(["export", str(tmp_path), "--format", "openrlhf", "--out", str(tmp_path / "o.jsonl")]) == 0
    assert "wrote" in capsys.readouterr().out
    rows = [json.loads(line) for line in (tmp_path / "o.jsonl").read_text().splitlines()]
    assert len(rows) == 2 and all(r["output"][1]["content"] == "5" for r in rows)
    with pytest.raises(SystemExit, match="writes .parquet"):
        main(["export", str(tmp_path / "more.jsonl"), "--format", "trl", "--out", str(tmp_path / "t.jsonl")])


def test_trl_export_loads_as_a_datasets_dataset_in_trl_columns(chain, tmp_path):
    datasets = pytest.importorskip("datasets", reason="the datasets package is not installed")
    from trl.data_utils import is_conversational

    path = write_format(chain, "trl", tmp_path / "trl.parquet").path
    ds = datasets.Dataset.from_parquet(str(path))
    row = ds[0]
    assert row["input_ids"] == [1, 2, 3, 4, 5, 6, 7, 8] and row["assistant_masks"] == [0, 0, 1, 1, 0, 0, 1, 1]
    assert is_conversational(row)  # GRPOTrainer / SFTTrainer read `prompt` / `completion` as chat
    assert row["prompt"] == [{"role": "user", "content": "2 + 3?"}]
    assert row["completion"][0]["tool_calls"][0]["function"] == {"name": "add", "arguments": '{"a": 2, "b": 3}'}
    assert row["completion"][1]["tool_call_id"] == "call_1" and row["reward"] == 1.0


@pytest.mark.torch
@pytest.mark.slow
def test_trl_sft_trainer_trains_on_the_generated_tokens_only(chain, tmp_path, tiny_model_dir):
    """TRL's own preparation of a pre-tokenized dataset: labels are the tokens where assistant_masks is 1."""
    datasets = pytest.importorskip("datasets")
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import SFTConfig, SFTTrainer

    path = write_format(chain, "trl", tmp_path / "trl.parquet").path
    ds = datasets.Dataset.from_parquet(str(path))
    trainer = SFTTrainer(model=AutoModelForCausalLM.from_pretrained(tiny_model_dir),
                         processing_class=AutoTokenizer.from_pretrained(tiny_model_dir), train_dataset=ds,
                         args=SFTConfig(output_dir=str(tmp_path / "sft"), report_to=[], max_steps=1,
                                        per_device_train_batch_size=1, use_cpu=True, dataset_num_proc=None))
    prepared = trainer.train_dataset[0]
    assert prepared["input_ids"] == [1, 2, 3, 4, 5, 6, 7, 8]
    assert prepared["labels"] == [-100, -100, 3, 4, -100, -100, 7, 8]
    trainer.train()  # one step on it


def test_openrlhf_export_reads_with_openrlhfs_own_preprocessing(chain, tmp_path, tokenizer):
    prompts = pytest.importorskip(
        "openrlhf.datasets.prompts_dataset",
        reason="openrlhf is not installed: 0.11.2 pins deepspeed==0.19.6 and flash-attn==2.8.3 (CUDA builds)")
    from openrlhf.datasets import sft_dataset

    path = write_format(chain, "openrlhf", tmp_path / "o.jsonl").path
    row = json.loads(path.read_text().splitlines()[0])
    template = tokenizer.apply_chat_template
    prompt, label = prompts.preprocess_data(row, input_key="input", label_key="reward", apply_chat_template=template)
    assert prompt == "<|im_start|>user\n2 + 3?<|im_end|>\n<|im_start|>assistant\n" and label == 1.0
    sft_prompt, response = sft_dataset.preprocess_data(row, input_key="input", output_key="output",
                                                       apply_chat_template=template)
    assert sft_prompt == prompt and "<tool_call>" in response and "<tool_response>\n5" in response
    assert response.endswith("5<|im_end|>\n")
