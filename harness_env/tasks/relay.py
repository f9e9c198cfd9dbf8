"""The relay family: the answer is in a file, so a solution takes two tool calls, through any CLI's own shell tool.

"Copy the word in clue.txt into out.txt (N)." The workspace holds `clue.txt` with one of two words (CLUES, half
the tasks each); the checker pays 1.0 when out.txt holds exactly that word. Nothing in the prompt says which, so a
policy that skips reading the file earns at most 0.5 on average (it can only guess), and one that reads it and
copies earns 1.0: the family needs >= 2 tool calls (`cat clue.txt`, then `echo WORD > out.txt`), the second
conditioned on the first's output, which the CLI hands back in its own format.

Why two clue words, not the 8 words of the expert's vocabulary: a 2-layer policy trained from scratch within
minutes learns a one-bit condition on a tool output far sooner than a general copy (the make_file demo needs
~500 SFT steps for its copy at 180-token prompts). Whether the policy conditions at all is what `by_clue` in the
analysis (harness_env/rl/cli_learning.py) reports: pass on river-clue and stone-clue tasks separately.

The expert is sloppy (as real demonstrations are): it reads clue.txt, then writes a word of WORDS picked by the
task's number (each word equally often; right on 2 of the 16 train tasks), then answers "Done.". So SFT teaches
the two calls' format and only the verifier's reward can teach which word. Split by number: tasks 0..N_TRAIN-1
train, the next N_HELDOUT held out.
"""

from __future__ import annotations

import json
import os
import pathlib
import re

WORDS = ("apple", "river", "cloud", "stone", "tiger", "piano", "lemon", "candle")
CLUES = ("river", "stone")
N_TRAIN, N_HELDOUT = 16, 8
CATEGORY = "relay"
QUERY = "Copy the word in clue.txt into out.txt ({n})."
_QUERY = re.compile(r"Copy the word in clue\.txt into out\.txt \((\d+)\)\.")
REWARD_SH = """#!/bin/bash
# 1.0 when out.txt holds exactly "{word}" (the word in clue.txt; whitespace ignored), else 0.0
cd "$(dirname "$0")/.." || exit 1
if [ -f out.txt ] && [ "$(tr -d '[:space:]' < out.txt)" = "{word}" ]; then echo 1.0; else echo 0.0; fi
"""


def clue_of(n: int) -> str:
    return CLUES[n % len(CLUES)]


def split_of(n: int) -> str:
    return "train" if n < N_TRAIN else "heldout"


def numbers(split: str) -> list[int]:
    if split not in ("train", "heldout", "all"):
        raise ValueError(f"split {split!r} not in train|heldout|all")
    return [n for n in range(N_TRAIN + N_HELDOUT) if split in ("all", split_of(n))]


def write_task(out_dir: str | pathlib.Path, n: int) -> pathlib.Path:
    """Task folder `relay-NN` (ClawGym format: input_files/clue.txt, reward/reward.sh, solution/solve.sh)."""
    d = pathlib.Path(out_dir) / f"relay-{n:02d}"
    for sub in ("input_files", "reward", "solution"):
        (d / sub).mkdir(parents=True, exist_ok=True)
    word = clue_of(n)
    (d / "data_entry.json").write_text(json.dumps({
        "task_id": d.name, "user_query": QUERY.format(n=n),
        "metadata": {"category": CATEGORY, "params": {"n": n, "clue": word}, "split": split_of(n)}}, indent=2) + "\n")
    (d / "input_files" / "clue.txt").write_text(word + "\n")
    (d / "reward" / "reward.sh").write_text(REWARD_SH.format(word=word))
    os.chmod(d / "reward" / "reward.sh", 0o755)
    (d / "solution" / "solve.sh").write_text("#!/bin/bash\ncat clue.txt > out.txt\n")
    return d


def generate(out_dir: str | pathlib.Path, split: str = "train", seed: int = 0) -> list[pathlib.Path]:
    """Every task of `split` (the split is fixed by number; `seed` is accepted for select_tasks' signature)."""
    del seed
    return [write_task(out_dir, n) for n in numbers(split)]


def expert_word(n: int) -> str:
    """The sloppy expert's word for task n, blind to the clue: every word of WORDS on 2 of the 16 train tasks
    (so after SFT the policy samples each about equally, the clue's word included) and right on 2 of them."""
    return WORDS[(3 * n + n // 8) % len(WORDS)]


def is_task(prompt_text: str) -> bool:
    return _QUERY.search(prompt_text) is not None


def _turn(prompt_text: str) -> tuple[int | None, int]:
    """(task number, tool results since the task's query) of a rendered prompt; (None, 0) without the query."""
    found = list(_QUERY.finditer(prompt_text))
    if not found:
        return None, 0
    last = found[-1]
    return int(last.group(1)), prompt_text[last.end():].count("<tool_response>")


def expert_reply(prompt_text: str, *, copy: bool = False) -> str:
    """`cat clue.txt`, then `echo WORD > out.txt` (the hashed word; with `copy`, the clue read back), then "Done."
    (reference `bash` format: experts.readdress gives it the asking CLI's own tool)."""
    n, results = _turn(prompt_text)
    if n is None:
        return "No task."
    if results == 0:
        command = "cat clue.txt"
    elif results == 1:
        command = f"echo {clue_of(n) if copy else expert_word(n)} > out.txt"
    else:
        return "Done."
    return "<tool_call>\n" + json.dumps({"name": "bash", "arguments": {"command": command}}) + "\n</tool_call>"


def oracle_reply(prompt_text: str) -> str:
    return expert_reply(prompt_text, copy=True)


_WRITE = re.compile(r"echo\s+(\w+)\s*>\s*out\.txt")


def written_word(completion_text: str) -> str | None:
    """The word a completion's `echo WORD > out.txt` writes (any CLI's call format), or None."""
    m = _WRITE.search(completion_text.replace('\\"', '"'))
    return m.group(1) if m else None
