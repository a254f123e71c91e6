"""The end-of-run PNG: reward and held-out accuracy per step and against training seconds (where asynchronous steps
show their gain), and the step-time breakdown."""

from __future__ import annotations

from pathlib import Path

PHASES = ("timing/generation_s", "timing/logprobs_s", "timing/policy_training_s", "timing/refit_s")


def plot_run(rows: list[dict[str, float]], out: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    evals = [r for r in rows if "eval/accuracy" in r]
    rows = [r for r in rows if "timing/total_s" in r]  # the step-0 row holds only held-out metrics
    steps = [r["step"] for r in rows]
    fig, (ax_r, ax_w, ax_t) = plt.subplots(1, 3, figsize=(16, 4))
    ax_r.plot(steps, [r["reward/mean"] for r in rows], marker="o", label="batch mean reward")
    if evals:
        ax_r.plot([r["step"] for r in evals], [r["eval/accuracy"] for r in evals], marker="s", label="eval/accuracy")
        if any("eval/pass@k" in r for r in evals):
            at = [r for r in evals if "eval/pass@k" in r]
            ax_r.plot([r["step"] for r in at], [r["eval/pass@k"] for r in at], marker="^", label="eval/pass@k")
    ax_r.set(xlabel="step", ylabel="reward / accuracy", title="reward and held-out accuracy", ylim=(0, 1.05))
    ax_r.legend(fontsize=8)
    rewards = [r["reward/mean"] for r in rows]
    ax_w.plot([r["time/train_s"] for r in rows], rewards, marker="o", label="batch mean reward")
    if evals:
        seconds = [r.get("time/train_s", 0.0) for r in evals]  # the step-0 evaluation comes before any training
        ax_w.plot(seconds, [r["eval/accuracy"] for r in evals], marker="s", label="eval/accuracy")
    ax_w.set(xlabel="training seconds", ylabel="reward / accuracy", title="against time", ylim=(0, 1.05))
    ax_w.legend(fontsize=8)
    bottom = [0.0] * len(rows)
    for key in PHASES:
        vals = [r[key] for r in rows]
        ax_t.bar(steps, vals, bottom=bottom, label=key.removeprefix("timing/").removesuffix("_s"))
        bottom = [b + v for b, v in zip(bottom, vals)]
    ax_t.plot(steps, [r["timing/total_s"] for r in rows], color="k", label="total")
    ax_t.set(xlabel="step", ylabel="seconds", title="step time breakdown")
    ax_t.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out
