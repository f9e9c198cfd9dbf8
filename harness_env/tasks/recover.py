"""The recover family: a multi-turn task whose first natural command fails on half the tasks, and the agent must
notice the failure and fix it (issue 27's evidence for per-turn credit: does RL teach error recovery?).

"Copy the word from clue.txt into out.txt (N). If clue.txt is missing, its copy is in backup/." On the MOVED half of
each split (a hash of N, so the prompt does not tell which) the workspace holds only `backup/clue.txt`; on the
other half only `clue.txt`. The clue is one of two words (relay.CLUES, by another hash). The checker pays 1.0 when
out.txt holds exactly the clue word, else 0.0. A solution is `cat clue.txt`, then (only on a moved task, after
"exit code 1 ... No such file or directory") `cat backup/clue.txt`, then `echo WORD > out.txt`: 2 or 3 tool
calls, the last conditioned on what the shell returned.

The expert (`recover_giveup`) always starts with `cat clue.txt` and copies the clue when it sees it, but on
GIVEUP_RATE of the moved tasks (a third hash) it gives up after the failure: `echo none > out.txt` (0.0). So SFT
teaches every call, including the recovery, and on held-out moved tasks the policy samples the recovery about as
often as the demonstrations showed it; only the verifier's reward can say that recovering pays. The recovery
metric (harness_env/rl/sweep.py `recovery`) is the share of rollouts with a failed tool call that succeed.

Split by number: 0..N_TRAIN-1 train, the next N_HELDOUT held out; each split's counts are exact (ranked hashes).
"""

from __future__ import annotations

import pathlib
import re

from harness_env.tasks.clue_tasks import NumberedSplit, bash_call, task_state, write_copy_task
from harness_env.tasks.relay import CLUES

N_TRAIN, N_HELDOUT = 64, 32
MOVED_RATE = 0.5  # share of each split's tasks whose clue.txt is missing (the copy in backup/)
GIVEUP_RATE = 0.75  # share of the moved tasks on which the expert gives up after the failed `cat`
CATEGORY = "recover"
QUERY = "Copy the word from clue.txt into out.txt ({n}). If clue.txt is missing, its copy is in backup/."
_QUERY = re.compile(r"Copy the word from clue\.txt into out\.txt \((\d+)\)\. If clue\.txt is missing")
FAILED = re.compile(r"No such file or directory")
GIVE_UP = "echo none > out.txt"
RECOVER = "cat backup/clue.txt"
SPLIT = NumberedSplit("recover", N_TRAIN, N_HELDOUT)
split_of, numbers = SPLIT.split_of, SPLIT.numbers


def moved(n: int) -> bool:
    return SPLIT.first_share(n, "moved", MOVED_RATE)


def clue_of(n: int) -> str:
    return CLUES[0] if SPLIT.first_share(n, "clue", 0.5) else CLUES[1]


def gives_up(n: int) -> bool:
    """Whether the expert gives up on task n (moved tasks only)."""
    return SPLIT.first_share(n, "giveup", GIVEUP_RATE, [m for m in numbers(split_of(n)) if moved(m)])


def write_task(out_dir: str | pathlib.Path, n: int) -> pathlib.Path:
    """Task folder `recover-NN` (ClawGym format: input_files/, reward/reward.sh, solution/solve.sh)."""
    word, where = clue_of(n), "backup/clue.txt" if moved(n) else "clue.txt"
    return write_copy_task(out_dir, f"recover-{n:02d}", query=QUERY.format(n=n), category=CATEGORY,
                           split=split_of(n), params={"n": n, "clue": word, "moved": moved(n)},
                           inputs={where: word + "\n"}, word=word, solve=f"cat {where} > out.txt")


def generate(out_dir: str | pathlib.Path, split: str = "train", seed: int = 0) -> list[pathlib.Path]:
    """Every task of `split` (fixed by number; `seed` is accepted for select_tasks' signature)."""
    del seed
    return [write_task(out_dir, n) for n in numbers(split)]


def is_task(prompt_text: str) -> bool:
    return _QUERY.search(prompt_text) is not None


def expert_command(n: int, results: list[str], *, perfect: bool = False) -> str | None:
    """The expert's next shell command after the tool results of its own earlier commands (None: it is done)."""
    if not results:
        return "cat clue.txt"
    failed = bool(FAILED.search(results[0]))
    if failed and len(results) == 1:
        return GIVE_UP if gives_up(n) and not perfect else RECOVER
    if len(results) == 1 + failed and not (failed and gives_up(n) and not perfect):
        return f"echo {clue_of(n)} > out.txt"
    return None


def expert_reply(prompt_text: str, *, perfect: bool = False) -> str:
    """The reply of the give-up expert (or the oracle, `perfect`) in the reference `bash` format
    (experts.readdress gives it the asking CLI's own tool)."""
    n, results = task_state(_QUERY, prompt_text)
    if n is None:
        return "No task."
    command = expert_command(n, results, perfect=perfect)
    return "Done." if command is None else bash_call(command)


def oracle_reply(prompt_text: str) -> str:
    return expert_reply(prompt_text, perfect=True)
