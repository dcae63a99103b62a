"""PNG plots of a summarized run: latency breakdown, acceptance by position, speedup vs k."""

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402

from orchestrator.latency.summary import leviathan_bound  # noqa: E402
from orchestrator.tracing import PHASES  # noqa: E402

_COLORS = dict(zip(PHASES, plt.get_cmap("tab20").colors))


def latency_breakdown(run: dict, path: Path) -> Path:
    """One stacked bar per side: ms per generated token, one segment per (phase, device track)."""
    fig, ax = plt.subplots(figsize=(9, 5))
    labels = [s["name"] for s in run["sides"]]
    seen = set()
    for x, side in enumerate(run["sides"]):
        sm = side["summary"]
        bottom = 0.0
        for phase, stats in sm["phases"].items():
            for track, ms in sorted(stats["by_track_ms"].items()):
                height = ms / max(1, sm["output_tokens"])
                label = f"{phase} ({track})"
                ax.bar(x, height, bottom=bottom, color=_COLORS.get(phase, "grey"), edgecolor="white",
                       linewidth=0.5, label=None if label in seen else label)
                seen.add(label)
                bottom += height
        wall = sm["wall_ms"] / max(1, sm["output_tokens"])
        ax.plot([x - 0.4, x + 0.4], [wall, wall], color="black", linewidth=1)
        ax.annotate(f"wall {wall:.1f}", (x, wall), textcoords="offset points", xytext=(0, 3), ha="center",
                    fontsize=8)
    ax.set_xticks(range(len(labels)), labels)
    ax.set_ylabel("ms per generated token")
    ax.set_title(f"Where the time went ({run['profile']['name']}, {run['workload']['name']}): "
                 "phases on each device track")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    return _save(fig, path)


def acceptance_by_position(run: dict, path: Path) -> Path:
    """Share of steps whose first j drafts were all accepted, per draft position j, per k."""
    fig, ax = plt.subplots(figsize=(7, 4.5))
    spec = [s for s in run["sides"] if s["k"]]
    width = 0.8 / max(1, len(spec))
    for i, side in enumerate(spec):
        acc = side["summary"]["acceptance"]["acceptance_per_position"]
        xs = [j + 1 + (i - (len(spec) - 1) / 2) * width for j in range(len(acc))]
        ax.bar(xs, acc, width=width, label=f"{side['name']} (α = {side['summary']['acceptance']['alpha']:.2f})")
    ax.set_xlabel("draft position j")
    ax.set_ylabel("P(drafts 1..j all accepted)")
    ax.set_ylim(0, 1)
    ax.set_xticks(range(1, max((len(s["summary"]["acceptance"]["acceptance_per_position"]) for s in spec),
                               default=1) + 1))
    ax.set_title("Acceptance by draft position")
    ax.legend(fontsize=8)
    return _save(fig, path)


def speedup_vs_k(run: dict, path: Path) -> Path:
    """Measured speedups per fixed k, the auto policy's as a line, against the Leviathan bound."""
    fig, ax = plt.subplots(figsize=(10, 4.5))
    sides = [s["summary"]["speculation"] for s in run["sides"] if s["k"]]
    spec = [s for s in sides if s["policy"] == "fixed"]
    ks = [s["k"] for s in spec]
    summary = run["summary"]
    curve_k = list(range(1, max(ks + [1]) + 3))
    ax.plot(curve_k, [leviathan_bound(summary["alpha"], k, summary["c"]) for k in curve_k], color="grey",
            label=f"bound, α = {summary['alpha']:.2f}, c = {summary['c']:.3f} ({summary['headline']})")
    ax.scatter(ks, [s["bound"] for s in spec], marker="x", color="grey", label="bound from each k's own α, c")
    ax.plot(ks, [s["speedup_decode"] for s in spec], "o-", label="measured, decode (TPOT ratio)")
    ax.plot(ks, [s["speedup"] for s in spec], "s--", label="measured, end to end (tokens/s ratio)")
    for s in sides:
        if s["policy"] != "fixed":
            ax.axhline(s["speedup"], color="green", linestyle=":",
                       label=f"{s['policy']} k (mean {s['mean_k']:.1f}), end to end")
    ax.axhline(1.0, color="black", linewidth=0.6)
    ax.set_xlabel("draft length k")
    ax.set_ylabel(f"speedup over {summary['baseline']}")
    ax.set_title("Speedup vs draft length")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    return _save(fig, path)


def write_plots(run: dict, out_dir: Path) -> list[Path]:
    return [latency_breakdown(run, out_dir / "latency.png"),
            acceptance_by_position(run, out_dir / "acceptance.png"),
            speedup_vs_k(run, out_dir / "speedup.png")]


def _save(fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
