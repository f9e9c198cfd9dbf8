"""What a run prints: one line per step with its numbers and an ETA, and no library chatter.

The README's main command used to print ~250 lines of orbax INFO (every checkpoint save) around its few useful
lines, with no way to tell how long the run had left. Libraries that log through absl (orbax, absl's own
internals) are held to WARNING unless the user asks for `--verbosity`; the loop prints `Progress` lines.

On a terminal the phases also draw tqdm bars (SFT steps, RL steps, eval rollouts) below those lines; in a log
file (CI, nohup) a redrawn bar is noise, so there only the lines are written.
"""

from __future__ import annotations

import logging
import sys
import time
import weakref

QUIET = ("absl", "orbax", "jax._src", "grain")
_BARS: weakref.WeakSet = weakref.WeakSet()  # the bars `bar` made, for `close_bars`


def quiet_libraries(verbose: bool) -> None:
    """Library loggers at WARNING (ours, `research.*` and `harness_env.*`, stay at INFO) unless `verbose`."""
    logging.getLogger().setLevel(logging.INFO)
    for name in QUIET:
        logging.getLogger(name).setLevel(logging.INFO if verbose else logging.WARNING)


def on_terminal() -> bool:
    """Whether bars are drawn: stderr (where both bars and log lines go) is a terminal."""
    return sys.stderr.isatty()


def bar(desc: str, total: int, *, enabled: bool = True, initial: int = 0, unit: str = "step", leave: bool = True):
    """A tqdm bar on stderr, drawn only when `enabled` and on a terminal (else a disabled bar: same calls, no
    output). While bars are drawn, log records are written between them, never into a bar's row."""
    from tqdm import tqdm

    show = enabled and on_terminal()
    if show:
        _log_between_bars()
    b = tqdm(total=total, initial=initial, desc=desc, unit=unit, disable=not show, dynamic_ncols=True, leave=leave)
    _BARS.add(b)
    return b


def close_bars() -> None:
    """Closes the bars still open (a phase that ended by an error, a resumed phase with nothing left to do),
    so a traceback or the summary starts on a row of its own."""
    for b in list(_BARS):
        b.close()


def _log_between_bars() -> None:
    """Makes each root handler clear the bars before a record and redraw them after (what tqdm.write does).

    The handlers are patched in place rather than replaced: absl re-adds its handler when it finds it missing
    from the root logger, which would print every line twice."""
    from tqdm import tqdm

    for h in logging.getLogger().handlers:
        if "handle" in vars(h):  # patched already
            continue

        def handle(record, inner=h.handle):
            with tqdm.external_write_mode(file=sys.stderr):
                return inner(record)

        h.handle = handle


def _clock(s: float) -> str:
    s = int(round(s))
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


class Progress:
    """Lines like `[rl 3/10] reward 0.500 pass 0.500 kl 0.0021 | 8.1 s/step, ETA 0m57s`.

    s/step and the ETA come from the steps this process ran (a resumed run does not count the steps it
    skipped); `every` thins the lines of long phases (SFT) to about 20, the last step always printed. On a
    terminal a bar labelled `phase` follows every step (`bar`), closed at the last one or by `close`."""

    def __init__(self, phase: str, total: int, *, done: int = 0, lines: int = 0):
        self.phase, self.total, self.first = phase, total, done
        self.every = max(1, total // lines) if lines else 1
        self.t0 = time.monotonic()
        self.bar = bar(phase, total, initial=done)

    def line(self, step: int, values: dict[str, float | int | None]) -> str | None:
        """The line for `step` (1-based, after it ran), or None when `every` skips it; moves the bar to `step`."""
        nums = " ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}" for k, v in values.items()
                        if v is not None)
        self.bar.set_postfix_str(nums, refresh=False)
        self.bar.update(step - self.bar.n)
        if step >= self.total:
            self.close()
        if step % self.every and step != self.total:
            return None  # the RL loop's `every` is 1: never None there
        ran = step - self.first
        per = (time.monotonic() - self.t0) / ran if ran > 0 else float("nan")
        eta = _clock(per * (self.total - step)) if ran > 0 else "?"
        return f"[{self.phase} {step}/{self.total}] {nums} | {per:.1f} s/step, ETA {eta}"

    def close(self) -> None:
        """Ends the bar (its last state stays on screen); the phase's end or its error, whichever comes first."""
        self.bar.close()
