"""One math-agent episode against a running rlgate gateway.

The agents (``rlgate.demo.math_agent``: ``MathAgent`` on the Anthropic SDK,
``OpenAIMathAgent`` on the OpenAI SDK) use only the public SDKs; this script starts a
session with :class:`rlgate.GatewayClient`, runs one episode, sets the reward and prints
what the export recorded::

    rlgate serve --model DIR &                      # prints the admin key
    python examples/math_agent.py --admin-key KEY --sdk anthropic \\
        --question "What is 6 * 7?" --answer 42
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
from typing import Any

from rlgate import GatewayClient
from rlgate.demo.math_agent import MathAgent, OpenAIMathAgent


async def episode(args: argparse.Namespace) -> dict[str, Any]:
    data = {"question": args.question, "answer": args.answer, "max_tokens": args.max_tokens}
    async with GatewayClient(args.base_url, args.admin_key) as gateway:
        async with gateway.session("math-agent") as session:
            if args.sdk == "anthropic":
                reward = await MathAgent(model=args.model).run(
                    data, base_url=session.anthropic_base_url, api_key=session.api_key)
            else:
                reward = await OpenAIMathAgent(model=args.model).run(
                    data, base_url=session.base_url, api_key=session.api_key)
            await session.set_reward(reward)
        export = await session.export()
    item = export["interactions"][0]
    return {
        "session_id": export["session_id"],
        "reward": reward,
        "reply": item["output_message"],
        "prompt_tokens": item["loss_mask"].index(1) if 1 in item["loss_mask"] else len(item["loss_mask"]),
        "generated_tokens": sum(item["loss_mask"]),
    }


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description="Run one math-agent episode against an rlgate gateway.")
    p.add_argument("--base-url", default="http://127.0.0.1:8000", help="gateway root URL")
    p.add_argument("--admin-key", default=os.environ.get("RLGATE_ADMIN_KEY"),
                   help="the gateway's admin key (default: $RLGATE_ADMIN_KEY)")
    p.add_argument("--sdk", choices=["anthropic", "openai"], default="anthropic")
    p.add_argument("--model", default="rlgate")
    p.add_argument("--question", default="Natalia sold 48 clips in April and half as many in May. "
                                         "How many clips did she sell altogether?")
    p.add_argument("--answer", default="72")
    p.add_argument("--max-tokens", type=int, default=32)
    args = p.parse_args(argv)
    if not args.admin_key:
        p.error("--admin-key (or RLGATE_ADMIN_KEY) is required")
    print(json.dumps(asyncio.run(episode(args)), indent=2, ensure_ascii=False))


if __name__ == "__main__":
    main()
