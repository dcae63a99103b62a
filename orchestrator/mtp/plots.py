"""Training curves of an MTP drafter: losses per step, held-out acceptance per draft position."""

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402


def plot_training(history: list[dict], path: Path) -> Path:
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    steps = [h["step"] for h in history]
    for key in ("loss", "feature", "soft", "hard"):
        left.plot(steps, [h[key] for h in history], label=key, linewidth=0.8)
    left.set_xlabel("step")
    left.set_ylabel("training loss")
    left.set_yscale("log")
    left.legend(fontsize=8)
    left.set_title("Distillation losses")
    evals = [h for h in history if "eval" in h]
    if evals:
        shares = [_all_right(h["eval"]) for h in evals]
        for j in range(len(shares[-1])):
            right.plot([h["step"] for h in evals], [share[j] for share in shares], "o-",
                       label=f"drafts 1..{j + 1} all right")
        right.plot([h["step"] for h in evals], [h["eval"]["top1"] for h in evals], "k--",
                   label="top-1 agreement, all held-out")
    right.plot(steps, [h["top1"] for h in history], color="grey", linewidth=0.5, label="top-1, training batch")
    right.set_ylim(0, 1)
    right.set_xlabel("step")
    right.set_ylabel("held-out, greedy: share of drafting steps")
    right.set_title("Held-out acceptance by draft position")
    right.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _all_right(report: dict) -> list[float]:
    """P(drafts 1..j all right) per j (older reports give only the conditional rates)."""
    if "all_right" in report:
        return report["all_right"]
    out, run = [], 1.0
    for a in report["alpha"]:
        run *= a
        out.append(run)
    return out
