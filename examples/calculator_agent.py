"""One multi-turn tool-use episode against a running rlgate gateway.

``rlgate.demo.calculator_agent.CalculatorAgent`` (OpenAI SDK only) offers the model a
``calculator`` tool, runs every call it makes and sends the result back, until the model
answers. This script runs one episode and prints the turns the export recorded::

    python examples/calculator_agent.py --admin-key KEY --question "What is 37 + 48?" --answer 85
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
from typing import Any

from rlgate import GatewayClient
from rlgate.demo.calculator_agent import CalculatorAgent


async def episode(args: argparse.Namespace) -> dict[str, Any]:
    data = {"question": args.question, "answer": args.answer}
    async with GatewayClient(args.base_url, args.admin_key) as gateway:
        async with gateway.session("calculator-agent") as session:
            reward = await CalculatorAgent(model=args.model).run(data, base_url=session.base_url,
                                                                 api_key=session.api_key)
            await session.set_reward(reward)
        export = await session.export()
    return {
        "session_id": export["session_id"],
        "reward": reward,
        "turns": [item["output_message"] for item in export["interactions"]],
    }


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description="Run one calculator-agent episode against an rlgate gateway.")
    p.add_argument("--base-url", default="http://127.0.0.1:8000", help="gateway root URL")
    p.add_argument("--admin-key", default=os.environ.get("RLGATE_ADMIN_KEY"),
                   help="the gateway's admin key (default: $RLGATE_ADMIN_KEY)")
    p.add_argument("--model", default="rlgate")
    p.add_argument("--question", default="What is 37 + 48?")
    p.add_argument("--answer", default="85")
    args = p.parse_args(argv)
    if not args.admin_key:
        p.error("--admin-key (or RLGATE_ADMIN_KEY) is required")
    print(json.dumps(asyncio.run(episode(args)), indent=2, ensure_ascii=False))


if __name__ == "__main__":
    main()
