"""What the numbered clue-word families (relay, recover) share: a split fixed by task number, exact shares of a
split chosen by a salted hash, the ClawGym task folder with a copy-the-clue checker, and the expert's reply format.

Why a hash and exact counts: the prompt shows the task number, so any property the policy must read from the
workspace (which clue word, whether the file moved) must not follow from the number's parity or order, and each
split must hold exactly the share the family's docstring promises (tests count them).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import pathlib
import re

from research.shim.render import tool_results

COPY_REWARD_SH = """#!/bin/bash
# 1.0 when out.txt holds exactly "{word}" (the clue word; whitespace ignored), else 0.0
cd "$(dirname "$0")/.." || exit 1
if [ -f out.txt ] && [ "$(tr -d '[:space:]' < out.txt)" = "{word}" ]; then echo 1.0; else echo 0.0; fi
"""


@dataclasses.dataclass(frozen=True)
class NumberedSplit:
    """Tasks 0..n_train-1 are train, the next n_heldout held out; `family` salts every hash."""

    family: str
    n_train: int
    n_heldout: int

    def split_of(self, n: int) -> str:
        return "train" if n < self.n_train else "heldout"

    def numbers(self, split: str) -> list[int]:
        if split not in ("train", "heldout", "all"):
            raise ValueError(f"split {split!r} not in train|heldout|all")
        return [n for n in range(self.n_train + self.n_heldout) if split in ("all", self.split_of(n))]

    def first_share(self, n: int, salt: str, share: float, pool: list[int] | None = None) -> bool:
        """Whether n is among the `share` of `pool` (default: n's split) ranked first by a salted hash."""
        pool = self.numbers(self.split_of(n)) if pool is None else pool
        rank = sorted(pool, key=lambda m: hashlib.sha256(f"{self.family}:{salt}:{m}".encode()).hexdigest())
        return n in rank and rank.index(n) < round(share * len(rank))


def write_copy_task(out_dir: str | pathlib.Path, task_id: str, *, query: str, category: str, split: str,
                    params: dict, inputs: dict[str, str], word: str, solve: str) -> pathlib.Path:
    """A ClawGym task folder (data_entry.json, input_files/, reward/reward.sh, solution/solve.sh) whose checker pays
    1.0 when out.txt holds exactly `word`; `inputs` maps workspace paths to their text."""
    d = pathlib.Path(out_dir) / task_id
    for sub in ("input_files", "reward", "solution"):
        (d / sub).mkdir(parents=True, exist_ok=True)
    (d / "data_entry.json").write_text(json.dumps({
        "task_id": task_id, "user_query": query,
        "metadata": {"category": category, "params": params, "split": split}}, indent=2) + "\n")
    for rel, text in inputs.items():
        (d / "input_files" / rel).parent.mkdir(parents=True, exist_ok=True)
        (d / "input_files" / rel).write_text(text)
    (d / "reward" / "reward.sh").write_text(COPY_REWARD_SH.format(word=word))
    os.chmod(d / "reward" / "reward.sh", 0o755)
    (d / "solution" / "solve.sh").write_text(f"#!/bin/bash\n{solve}\n")
    return d


def task_state(query: re.Pattern, prompt_text: str) -> tuple[int | None, list[str]]:
    """(task number, the tool results since the task's last query) of a rendered prompt; (None, []) without it.
    `query`'s first group is the task number."""
    found = list(query.finditer(prompt_text))
    if not found:
        return None, []
    return int(found[-1].group(1)), tool_results(prompt_text[found[-1].end():])


def bash_call(command: str) -> str:
    """A reply in the reference `bash` tool format (experts.readdress gives it the asking CLI's own tool)."""
    return "<tool_call>\n" + json.dumps({"name": "bash", "arguments": {"command": command}}) + "\n</tool_call>"
