"""The reward curve: train reward per step (raw and smoothed) and evaluation results."""

from __future__ import annotations

from pathlib import Path


def plot_reward_curve(path: Path, history: list[dict[str, float]], evals: list[tuple[int, float]], *,
                      title: str = "rlgate train", eval_label: str = "eval reward", window: int = 5,
                      unit_range: bool = False) -> Path:
    """Write a PNG; ``unit_range`` fixes the y axis to [0, 1] (accuracies)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4), dpi=120)
    steps = [h["step"] for h in history]
    rewards = [h["reward"] for h in history]
    ax.plot(steps, rewards, label="train reward per step", color="tab:blue", alpha=0.35)
    smooth = [sum(rewards[max(0, i - window + 1):i + 1]) / len(rewards[max(0, i - window + 1):i + 1])
              for i in range(len(rewards))]
    ax.plot(steps, smooth, label=f"train reward, {window}-step mean", color="tab:blue")
    if evals:
        ax.plot([s for s, _ in evals], [a for _, a in evals], "o-", label=eval_label, color="tab:orange")
    ax.set_xlabel("GRPO step")
    ax.set_ylabel("reward")
    if unit_range:
        ax.set_ylim(-0.02, 1.02)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path
