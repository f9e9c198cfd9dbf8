"""What a run prints: one line per step with its numbers and an ETA, and no library chatter.

The README's main command used to print ~250 lines of orbax INFO (every checkpoint save) around its few useful
lines, with no way to tell how long the run had left. Libraries that log through absl (orbax, absl's own
internals) are held to WARNING unless the user asks for `--verbosity`; the loop prints `Progress` lines.
"""

from __future__ import annotations

import logging
import time

QUIET = ("absl", "orbax", "jax._src", "grain")


def quiet_libraries(verbose: bool) -> None:
    """Library loggers at WARNING (ours, `research.*` and `harness_env.*`, stay at INFO) unless `verbose`."""
    logging.getLogger().setLevel(logging.INFO)
    for name in QUIET:
        logging.getLogger(name).setLevel(logging.INFO if verbose else logging.WARNING)


def _clock(s: float) -> str:
    s = int(round(s))
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


class Progress:
    """Lines like `[rl 3/10] reward 0.500 pass 0.500 kl 0.0021 | 8.1 s/step, ETA 0m57s`.

    s/step and the ETA come from the steps this process ran (a resumed run does not count the steps it
    skipped); `every` thins the lines of long phases (SFT) to about 20, the last step always printed."""

    def __init__(self, phase: str, total: int, *, done: int = 0, lines: int = 0):
        self.phase, self.total, self.first = phase, total, done
        self.every = max(1, total // lines) if lines else 1
        self.t0 = time.monotonic()

    def line(self, step: int, values: dict[str, float | int | None]) -> str | None:
        """The line for `step` (1-based, after it ran), or None when `every` skips it."""
        if step % self.every and step != self.total:
            return None  # the RL loop's `every` is 1: never None there
        ran = step - self.first
        per = (time.monotonic() - self.t0) / ran if ran > 0 else float("nan")
        nums = " ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}" for k, v in values.items()
                        if v is not None)
        eta = _clock(per * (self.total - step)) if ran > 0 else "?"
        return f"[{self.phase} {step}/{self.total}] {nums} | {per:.1f} s/step, ETA {eta}"
