"""A parameterised task family a tiny model can learn by RL on CPU: "create file NAME containing WORD".

Every (NAME, WORD) pair is one ClawGym-format task folder (so it goes through the same runner, sandbox
and reward path as every other task). The split is by a stable hash of the pair: ~20% of pairs are
held out, and every held-out pair's WORD also appears in training with other names, so held-out
success measures generalisation of the skill, not memorisation. The checker is a few lines of bash
(fast: RL runs thousands of these) with partial credit for the right file with the wrong content.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import pathlib
import random
import re

NAMES = ("notes.txt", "answer.txt", "out.txt", "result.txt", "word.txt", "data.txt", "log.txt", "a.txt",
         "b.txt", "hello.txt", "final.txt", "memo.txt")
WORDS = ("apple", "river", "cloud", "stone", "tiger", "piano", "lemon", "rocket", "forest", "candle",
         "silver", "orange", "garden", "planet", "winter", "yellow")
CATEGORY = "make_file"

REWARD_SH = """#!/bin/bash
# 1.0: {name} holds exactly "{word}" (surrounding whitespace ignored); 0.3: the file exists; else 0.0.
cd "$(dirname "$0")/.." || exit 1
if [ -f {name} ]; then
  if [ "$(tr -d '[:space:]' < {name})" = "{word}" ]; then echo 1.0; else echo 0.3; fi
else
  echo 0.0
fi
"""


def split_of(name: str, word: str) -> str:
    h = int(hashlib.sha256(f"{name}/{word}".encode()).hexdigest()[:8], 16)
    return "heldout" if h % 5 == 0 else "train"


def pairs(split: str) -> list[tuple[str, str]]:
    if split not in ("train", "heldout", "all"):
        raise ValueError(f"split {split!r} not in train|heldout|all")
    return [(n, w) for n, w in itertools.product(NAMES, WORDS) if split == "all" or split_of(n, w) == split]


def write_task(out_dir: str | pathlib.Path, name: str, word: str) -> pathlib.Path:
    tid = f"make_file-{name.replace('.', '_')}-{word}"
    d = pathlib.Path(out_dir) / tid
    (d / "reward").mkdir(parents=True, exist_ok=True)
    (d / "solution").mkdir(exist_ok=True)
    entry = {"task_id": tid, "user_query": f"Create a file named {name} containing the word {word}.",
             "metadata": {"category": CATEGORY, "params": {"name": name, "word": word},
                          "split": split_of(name, word)}}
    (d / "data_entry.json").write_text(json.dumps(entry, indent=2) + "\n")
    (d / "reward" / "reward.sh").write_text(REWARD_SH.format(name=name, word=word))
    os.chmod(d / "reward" / "reward.sh", 0o755)
    (d / "solution" / "solve.sh").write_text(f"#!/bin/bash\necho {word} > {name}\n")
    return d


def generate(out_dir: str | pathlib.Path, split: str = "train", n: int | None = None,
             seed: int = 0) -> list[pathlib.Path]:
    """Writes n tasks of `split` (all when n is None), in an order shuffled deterministically by seed."""
    ps = pairs(split)
    random.Random(seed).shuffle(ps)
    return [write_task(out_dir, name, word) for name, word in ps[: n if n is not None else len(ps)]]


# Each expert's shell command on its right and on its mistaken tasks ("" = the perfect expert, no mistake)
_COMMANDS = {"": ("echo {word} > {name}", "echo {word} > {name}"),
             "literal": ("echo {word} > {name}", "echo the word {word} > {name}"),
             "period": ("echo {word} > {name}", "echo {word}. > {name}"),
             # both forms say "the word WORD"; the right one cuts WORD out of the phrase
             "cut": ("echo the word {word} | cut -d' ' -f3 > {name}", "echo the word {word} > {name}")}
_QUERY = re.compile(r"Create a file named (\S+) containing the word (\w+)\.")


IMPERFECT_RATE = 0.6  # share of the tasks on which the imperfect expert makes its mistake


def literal_mistake(name: str, word: str) -> bool:
    """Whether the imperfect expert gets (name, word) wrong: a fixed hash, ~IMPERFECT_RATE of all pairs."""
    h = int(hashlib.sha256(f"literal/{name}/{word}".encode()).hexdigest()[:8], 16)
    return (h % 1000) / 1000 < IMPERFECT_RATE


def expert_command(name: str, word: str, mistake: str = "") -> str:
    """The shell command the family's expert runs for (name, word); see `oracle_reply` for `mistake`."""
    if mistake not in _COMMANDS:
        raise ValueError(f"mistake {mistake!r} not in {sorted(_COMMANDS)}")
    right, wrong = _COMMANDS[mistake]
    return (wrong if mistake and literal_mistake(name, word) else right).format(name=name, word=word)


def oracle_reply(prompt_text: str, *, mistake: str = "") -> str:
    """The family's expert, in Qwen3's tool-call format (scripted engines in SFT demos, tests, benchmarks
    and `launch.eval --endpoint=oracle`): one shell call writing the file, then a plain answer once a tool
    result is in the prompt (a plain answer ends every harness's loop). Decides from the rendered prompt
    alone, so it is safe under any concurrency.

    `mistake` ("" = none) makes it an imperfect expert, as real demonstrators are: on the tasks where
    `literal_mistake` holds, "literal" writes the phrase "the word WORD" instead of WORD (the checker gives
    0.3) and "period" writes "WORD." (a trailing period; also 0.3). "cut" (the CPU demo's expert) writes
    `echo the word WORD > NAME` on those tasks (the literal mistake) and `echo the word WORD | cut -d' '
    -f3 > NAME` on the others (right): both behaviours copy WORD after the same words, so SFT learns the
    copy from every demonstration (an induction-friendly context: "the word" precedes WORD in the task
    text too), and right and wrong part at one token after it (" >" or " |"), where GRPO's signal falls
    (docs/experiments/2026-12-02-demo-grpo-diagnosis.md)."""
    found = _QUERY.findall(prompt_text)
    if not found:
        return "I cannot tell which file to create."
    name, word = found[-1]
    after = prompt_text[prompt_text.rfind(f"containing the word {word}.") :]
    if "<tool_response>" in after:
        return "Done."
    call = {"name": "bash", "arguments": {"command": expert_command(name, word, mistake)}}
    return "<tool_call>\n" + json.dumps(call) + "\n</tool_call>"


def imperfect_reply(prompt_text: str) -> str:
    return oracle_reply(prompt_text, mistake="literal")


def sloppy_reply(prompt_text: str) -> str:
    return oracle_reply(prompt_text, mistake="period")


def cut_reply(prompt_text: str) -> str:
    return oracle_reply(prompt_text, mistake="cut")


_REDIRECT = re.compile(r">\s*([^\s;&|>]+)")


def _command_of(reply: str) -> str | None:
    """The bash command of the reply's first parseable tool call (None: none)."""
    from harness_env.eval.analytics import parse_tool_calls

    cmd = next(iter(parse_tool_calls(reply)), ("", {}))[1].get("command")
    return cmd if isinstance(cmd, str) else None


def classify_answer(reply: str, name: str, word: str) -> dict:
    """What a policy's first reply to task (name, word) did: `form` is "cut" (`| cut ... > FILE`, the right
    form), "echo" (a plain `echo ... > FILE`) or "other" (no parseable tool call or no redirect); `name_ok`
    whether it writes to NAME; `word_ok` whether WORD follows "the word" or `echo`. Why: a held-out pass rate
    says how many tasks a policy solved, not which of the two skills it lacks (copying the name, choosing the
    form); the demo's seed sweep reports both (harness_env/rl/sweep.py)."""
    cmd = _command_of(reply)
    targets = _REDIRECT.findall(cmd) if cmd else []
    if not targets:
        return {"form": "other", "name_ok": False, "word_ok": False}
    return {"form": "cut" if "| cut" in cmd else "echo", "name_ok": targets[-1] == name,
            "word_ok": bool(re.search(rf"(?:the word|echo) {re.escape(word)}\b", cmd))}
