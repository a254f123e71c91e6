"""Collapse warnings while a run goes: held-out accuracy well below its start, or the completions' entropy, length or
EOS fraction shifting sharply from their running baseline. Fed every metrics row as it is written."""

from __future__ import annotations

import logging
import math
from dataclasses import asdict, dataclass

from services.common.config import AlertsSection as AlertThresholds

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Alert:
    signal: str
    """One of SIGNALS: eval_accuracy_drop, entropy_shift, length_shift, eos_shift."""
    step: int
    value: float
    baseline: float
    message: str


# (signal, the metrics-row key it watches); the row gets alert/<signal> = 1.0 when it fires, 0.0 when it does not.
SHIFTS = (
    ("entropy_shift", "response/neg_logprob"),
    ("length_shift", "avg_generated_tokens"),
    ("eos_shift", "response/eos_frac"),
)
SIGNALS = ("eval_accuracy_drop", *(signal for signal, _ in SHIFTS))
ALERT_KEYS = tuple(f"alert/{signal}" for signal in SIGNALS)


class RunningBaseline:
    """Exponentially weighted mean and variance of one per-step metric. Each value updates it clipped to the band
    that would not have warned, so a collapsed step does not inflate the spread that judges the next one, while a
    lasting shift is still absorbed within a few tens of steps."""

    def __init__(self, memory_steps: int):
        self.memory_steps, self.n, self.mean, self.var = memory_steps, 0, 0.0, 0.0

    @property
    def std(self) -> float:
        return math.sqrt(self.var)

    def update(self, x: float, band: float) -> None:
        self.n += 1
        alpha = max(1.0 / self.n, 1.0 / self.memory_steps)
        if self.n > 1:
            x = min(max(x, self.mean - band), self.mean + band)
        d = x - self.mean
        self.mean += alpha * d
        self.var = (1 - alpha) * (self.var + alpha * d * d)


class CollapseMonitor:
    """Keeps the first evaluation and a running baseline per shift signal; observe() judges each metrics row."""

    def __init__(self, thresholds: AlertThresholds | None = None, num_eval_prompts: int = 0, num_completions: int = 0):
        thresholds = thresholds or AlertThresholds()
        self.t, self.num_eval_prompts, self.num_completions = thresholds, num_eval_prompts, num_completions
        """Held-out prompts of an evaluation, and completions of a step (0 = unknown: the thresholds alone judge)."""
        self.first_eval: tuple[int, float] | None = None
        self.baselines = {signal: RunningBaseline(thresholds.baseline_steps) for signal, _ in SHIFTS}
        self.latest: dict[str, Alert] = {}
        """The last time each signal fired."""
        self.firing: set[str] = set()
        """Signals that fired on the latest row that carried their metric."""

    def observe(self, row: dict[str, float], quiet: bool = False) -> dict[str, float]:
        """alert/<signal> = 1.0 or 0.0 for the signals whose metric this row carries; logs a warning per firing one."""
        step = int(row["step"])
        judged: dict[str, Alert | None] = {}
        if "eval/accuracy" in row:
            judged["eval_accuracy_drop"] = self._eval_drop(step, row["eval/accuracy"])
        for signal, key in SHIFTS:
            if key in row:
                judged[signal] = self._shift(signal, key, step, row[key])
        for signal, alert in judged.items():
            if alert is None:
                self.firing.discard(signal)
                continue
            self.firing.add(signal)
            self.latest[signal] = alert
            if not quiet:
                log.warning("collapse warning at step %d: %s", step, alert.message)
        return {f"alert/{signal}": float(alert is not None) for signal, alert in judged.items()}

    def prime(self, rows: list[dict[str, float]]) -> None:
        """A resumed run: rebuild the baselines from the rows it already wrote, without warning again."""
        if self.first_eval is None and all(b.n == 0 for b in self.baselines.values()):
            for row in rows:
                self.observe(row, quiet=True)

    def status(self) -> list[dict]:
        """The last warning of each signal that ever fired, and whether it still fires: what /status shows."""
        return [{**asdict(a), "active": a.signal in self.firing} for a in self.latest.values()]

    def _eval_drop(self, step: int, accuracy: float) -> Alert | None:
        if self.first_eval is None:
            self.first_eval = (step, accuracy)
            return None
        first_step, first = self.first_eval
        stderr = math.sqrt(first * (1 - first) / self.num_eval_prompts) if self.num_eval_prompts else 0.0
        drop = max(self.t.eval_drop, self.t.eval_drop_stderrs * stderr)
        if accuracy >= first - drop:
            return None
        message = (
            f"eval_accuracy_drop: eval/accuracy {accuracy:.3f} is {first - accuracy:.3f} below its {first:.3f} at "
            f"step {first_step} (warns past {drop:.3f})"
        )
        return Alert("eval_accuracy_drop", step, accuracy, first, message)

    def _shift(self, signal: str, key: str, step: int, value: float) -> Alert | None:
        b = self.baselines[signal]
        mean, std = b.mean, b.std
        # The smallest move that matters: a fraction of the mean for entropy and length, absolute for the EOS share.
        min_shift = {
            "entropy_shift": self.t.entropy_min_shift * abs(mean),
            "length_shift": self.t.length_min_shift * abs(mean),
            "eos_shift": self.t.eos_min_shift,
        }[signal]
        band = max(self.t.shift_z * std, min_shift)
        judged = b.n >= self.t.warmup_steps
        b.update(value, band)
        if not judged or abs(value - mean) <= band:
            return None
        if signal == "eos_shift" and self.num_completions and self._eos_tail(value, mean) > self.t.eos_tail_p:
            return None
        z = (value - mean) / std if std > 0 else math.copysign(math.inf, value - mean)
        message = (
            f"{signal}: {key} {value:.4g} against a running baseline of {mean:.4g} +- {std:.2g} "
            f"(z {z:+.1f}, warns past {band:.3g})"
        )
        return Alert(signal, step, value, mean, message)

    def _eos_tail(self, share: float, baseline: float) -> float:
        """Chance of an EOS count at least as far from the baseline share as this step's, among its completions."""
        n = self.num_completions
        k, p = round(share * n), min(max(baseline, 0.5 / n), 1 - 0.5 / n)
        ks = range(k, n + 1) if share > baseline else range(0, k + 1)
        return sum(math.comb(n, i) * p**i * (1 - p) ** (n - i) for i in ks)
