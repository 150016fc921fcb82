"""Build a tiny, fully offline chat model: BPE tokenizer + ChatML template + Llama LM.

``build_tiny_model(out_dir, seed=0)`` writes a Hugging Face checkpoint directory that
``AutoTokenizer.from_pretrained`` and ``AutoModelForCausalLM.from_pretrained`` load.
``build_tiny_tokenizer(out_dir, seed=0)`` writes the same directory without the weights
(tokenizer, ``config.json``, ``generation_config.json``) and without importing torch: enough for
``rlgate serve --engine fake`` and every test that needs a tokenizer but no model.
Everything is deterministic for a given seed: the tokenizer is trained on a corpus
generated in code (no download), the weights come from a seeded initialisation.

The chat template follows Qwen2.5's (ChatML markup, tools listed in the system turn,
``<tool_call>`` JSON in assistant turns, consecutive tool results grouped into one
``user`` turn of ``<tool_response>`` blocks) with two differences: there is no default
system prompt, and an assistant message's ``reasoning_content`` is rendered as a
leading ``<think>…</think>`` block.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

SPECIAL_TOKENS = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<tool_call>",
    "</tool_call>",
    "<think>",
    "</think>",
]
# Tokens that are markup rather than control: decoding with skip_special_tokens keeps them
# (as in Qwen2.5, where <tool_call> and <think> are added but not "special").
_NON_CONTROL = {"<tool_call>", "</tool_call>", "<think>", "</think>"}

CHAT_TEMPLATE = r"""{%- macro render_content(content) -%}
{%- if content is string -%}{{ content }}
{%- elif content is none -%}
{%- else -%}{%- for part in content -%}{%- if part.type == 'text' -%}{{ part.text }}{%- elif part.type in ('image', 'image_url', 'input_image') -%}<image>{%- endif -%}{%- endfor -%}
{%- endif -%}
{%- endmacro -%}
{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0].role == 'system' %}
        {{- render_content(messages[0].content) + '\n\n' }}
    {%- endif %}
    {{- "# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>" }}
    {%- for tool in tools %}
        {{- "\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n" }}
{%- elif messages[0].role == 'system' %}
    {{- '<|im_start|>system\n' + render_content(messages[0].content) + '<|im_end|>\n' }}
{%- endif %}
{%- for message in messages %}
    {%- if message.role == "user" or (message.role == "system" and not loop.first) %}
        {{- '<|im_start|>' + message.role + '\n' + render_content(message.content) + '<|im_end|>\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>assistant\n' }}
        {%- if message.reasoning_content %}
            {{- '<think>\n' + message.reasoning_content + '\n</think>\n\n' }}
        {%- endif %}
        {{- render_content(message.content) }}
        {%- if message.tool_calls %}
            {%- for tool_call in message.tool_calls %}
                {%- if tool_call.function is defined %}
                    {%- set tool_call = tool_call.function %}
                {%- endif %}
                {%- if loop.first and message.content %}
                    {{- '\n' }}
                {%- elif not loop.first %}
                    {{- '\n' }}
                {%- endif %}
                {{- '<tool_call>\n{"name": "' }}
                {{- tool_call.name }}
                {{- '", "arguments": ' }}
                {%- if tool_call.arguments is string %}
                    {{- tool_call.arguments }}
                {%- else %}
                    {{- tool_call.arguments | tojson }}
                {%- endif %}
                {{- '}\n</tool_call>' }}
            {%- endfor %}
        {%- endif %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "tool" %}
        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' }}
        {{- render_content(message.content) }}
        {{- '\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
{%- endif %}
"""

_WORDS = (
    "the a an of to and in is it you that he was for on are with as his they be at one "
    "have this from or had by hot word but what some we can out other were all there when "
    "up use your how said each she which do their time if will way about many then them "
    "write would like so these her long make thing see him two has look more day could go "
    "come did number sound no most people my over know water than call first who may down "
    "side been now find any new work part take get place made live where after back little "
    "only round man year came show every good me give our under name very through just form "
    "sentence great think say help low line differ turn cause much mean before move right "
    "boy old too same tell does set three want air well also play small end put home read "
    "hand port large spell add even land here must big high such follow act why ask men "
    "change went light kind off need house picture try us again animal point mother world "
    "near build self earth father answer question result tool call function weather city "
    "search file read write list sum total price order user assistant system think step "
    "calculate compute multiply divide plus minus equals value error true false null"
).split()


def _corpus(seed: int) -> list[str]:
    """A deterministic training corpus: prose, arithmetic, JSON tool calls, chat markup."""
    rng = random.Random(seed)
    lines: list[str] = []
    for _ in range(3000):
        n = rng.randint(4, 16)
        words = [rng.choice(_WORDS) for _ in range(n)]
        s = " ".join(words)
        lines.append(s[0].upper() + s[1:] + rng.choice([".", "?", "!", ","]))
    for _ in range(3000):
        a, b = rng.randint(0, 999), rng.randint(0, 999)
        op = rng.choice(["+", "-", "*"])
        r = a + b if op == "+" else a - b if op == "-" else a * b
        lines.append(f"What is {a} {op} {b}? The answer is {r}.")
        lines.append(f"Compute {a}{op}{b} = {r}")
    for _ in range(500):
        name = rng.choice(["add", "multiply", "calculator", "get_weather", "search", "lookup"])
        args = {"a": rng.randint(0, 99), "b": rng.randint(0, 99)}
        lines.append(json.dumps({"name": name, "arguments": args}))
        lines.append(json.dumps({"type": "function", "function": {"name": name, "description":
                                 "Call the tool", "parameters": {"type": "object", "properties":
                                 {"a": {"type": "integer"}, "b": {"type": "string"}},
                                 "required": ["a"]}}}))
    lines += [
        "# Tools", "You may call one or more functions to assist with the user query.",
        "You are provided with function signatures within <tools></tools> XML tags:",
        "For each function call, return a json object with function name and arguments",
        "<tool_response>", "</tool_response>", "user", "assistant", "system", "tool",
        "You are a helpful assistant.",
    ]
    return lines


def build_tokenizer(seed: int = 0, vocab_size: int = 4096):
    """Train the byte-level BPE and wrap it as a ``PreTrainedTokenizerFast``."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    # Digits are split one by one (as in Qwen2.5), then GPT-2 style byte-level pieces.
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(r"\p{N}"), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(seed), trainer=trainer)
    tok.add_special_tokens([AddedToken(t, special=t not in _NON_CONTROL, normalized=False)
                            for t in SPECIAL_TOKENS])
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        model_max_length=2048,
        clean_up_tokenization_spaces=False,
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def _model_config(tokenizer, *, hidden_size: int, num_layers: int, num_heads: int, num_kv_heads: int,
                  intermediate_size: int, max_position_embeddings: int) -> tuple[dict, dict]:
    """The model's ``config.json`` fields and its ``generation_config.json`` (plain dicts: no torch)."""
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    eot = tokenizer.convert_tokens_to_ids("<|endoftext|>")
    config = dict(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=True,
        bos_token_id=eot,
        eos_token_id=[im_end, eot],
        pad_token_id=eot,
        initializer_range=0.02,
    )
    return config, dict(bos_token_id=eot, eos_token_id=[im_end, eot], pad_token_id=eot)


_SIZES = dict(hidden_size=256, num_layers=4, num_heads=4, num_kv_heads=2, intermediate_size=688,
              max_position_embeddings=2048)  # the defaults of build_tiny_model (3.2M parameters)


def build_tiny_tokenizer(out_dir: str | Path, *, seed: int = 0) -> Path:
    """Write the tiny model's directory without its weights (no torch): tokenizer, config, generation config."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer(seed)
    tokenizer.save_pretrained(out)
    config, generation = _model_config(tokenizer, **_SIZES)
    (out / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "model_type": "llama",
                                                 **config}, indent=2) + "\n")
    (out / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n")
    return out


def build_tiny_model(
    out_dir: str | Path,
    *,
    seed: int = 0,
    hidden_size: int = _SIZES["hidden_size"],
    num_layers: int = _SIZES["num_layers"],
    num_heads: int = _SIZES["num_heads"],
    num_kv_heads: int = _SIZES["num_kv_heads"],
    intermediate_size: int = _SIZES["intermediate_size"],
    max_position_embeddings: int = _SIZES["max_position_embeddings"],
) -> Path:
    """Write tokenizer + random-weight Llama model to ``out_dir``; return the path."""
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer(seed)
    tokenizer.save_pretrained(out)
    config, generation = _model_config(
        tokenizer, hidden_size=hidden_size, num_layers=num_layers, num_heads=num_heads, num_kv_heads=num_kv_heads,
        intermediate_size=intermediate_size, max_position_embeddings=max_position_embeddings)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(LlamaConfig(**config))
    model.generation_config = GenerationConfig(**generation)
    model.save_pretrained(out)
    return out
