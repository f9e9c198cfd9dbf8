"""The relay family: the answer is in a file, so a solution takes two tool calls, through any CLI's own shell tool.

"Copy the word in clue.txt into out.txt (N)." The workspace holds `clue.txt` with one of two words (CLUES, half
the tasks of each split each, assigned by a hash of N, so neither the number nor its parity tells which); the
checker pays 1.0 when out.txt holds exactly that word, else 0.0. Nothing in the prompt says which word, so a policy
that skips reading the file can only guess: the family needs >= 2 tool calls (`cat clue.txt`, then
`echo WORD > out.txt`), the second conditioned on the first's output as the CLI hands it back.

The expert always reads the clue and copies it, but on MISTAKE_RATE of the tasks (by a hash of N) in a literal
form, `echo the word WORD > out.txt` (0.0), as the make_file demo's expert does (harness_env/tasks/family.py): the
copy is demonstrated on every task, so SFT can teach the one-bit condition on the tool output; which form pays,
only the verifier's reward can teach, and that lesson holds on held-out tasks because it is the same everywhere.
Two pilots through Codex shaped it (docs/experiments/2026-12-04-relay-through-clis.md): an expert blind to the clue
(the policy memorised each train task's word; GRPO drove it to one favourite, held-out 0.19 -> 0.19), then this
expert with 0.3 for the literal form and 16 train tasks (SFT memorised each task's form; GRPO's signal was mostly
literal 0.3 over broken calls 0.0, so it reinforced the literal form: held-out 0.19 -> 0.09, while 94% of the
held-out second calls copied the clue right). Hence binary reward, and 64 train tasks of which every SFT step
samples 16.

Why two clue words: a 2-layer policy trained from scratch within minutes learns a one-bit condition on a tool
output far sooner than a general copy. `harness_env.rl.sweep.relay_answers` reports whether it conditions: pass
per clue word, the forms written and the share copied. Split by number: 0..N_TRAIN-1 train, the next N_HELDOUT held
out.
"""

from __future__ import annotations

import pathlib
import re

from harness_env.tasks.clue_tasks import NumberedSplit, bash_call, task_state, write_copy_task

WORDS = ("apple", "river", "cloud", "stone", "tiger", "piano", "lemon", "candle")
CLUES = ("river", "stone")
N_TRAIN, N_HELDOUT = 64, 16
MISTAKE_RATE = 0.625  # share of the tasks on which the expert writes the literal form (40 of the 64 train tasks)
CATEGORY = "relay"
QUERY = "Copy the word in clue.txt into out.txt ({n})."
_QUERY = re.compile(r"Copy the word in clue\.txt into out\.txt \((\d+)\)\.")
SPLIT = NumberedSplit("relay", N_TRAIN, N_HELDOUT)
split_of, numbers = SPLIT.split_of, SPLIT.numbers


def clue_of(n: int) -> str:
    """Half of each split's tasks per clue word, by a hash of n (not its parity, which the prompt shows)."""
    return CLUES[0] if SPLIT.first_share(n, "clue", 0.5) else CLUES[1]


def literal_mistake(n: int) -> bool:
    return SPLIT.first_share(n, "form", MISTAKE_RATE)


def write_task(out_dir: str | pathlib.Path, n: int) -> pathlib.Path:
    """Task folder `relay-NN` (ClawGym format: input_files/clue.txt, reward/reward.sh, solution/solve.sh)."""
    word = clue_of(n)
    return write_copy_task(out_dir, f"relay-{n:02d}", query=QUERY.format(n=n), category=CATEGORY, split=split_of(n),
                           params={"n": n, "clue": word}, inputs={"clue.txt": word + "\n"}, word=word,
                           solve="cat clue.txt > out.txt")


def generate(out_dir: str | pathlib.Path, split: str = "train", seed: int = 0) -> list[pathlib.Path]:
    """Every task of `split` (the split is fixed by number; `seed` is accepted for select_tasks' signature)."""
    del seed
    return [write_task(out_dir, n) for n in numbers(split)]


def is_task(prompt_text: str) -> bool:
    return _QUERY.search(prompt_text) is not None


def expert_reply(prompt_text: str, *, perfect: bool = False) -> str:
    """`cat clue.txt`, then the clue's word into out.txt (in the literal form on the mistaken tasks, unless
    `perfect`), then "Done." (reference `bash` format: experts.readdress gives it the asking CLI's own tool)."""
    n, results = task_state(_QUERY, prompt_text)
    if n is None:
        return "No task."
    if not results:
        return bash_call("cat clue.txt")
    if len(results) == 1:
        literal = literal_mistake(n) and not perfect
        return bash_call(f"echo {'the word ' if literal else ''}{clue_of(n)} > out.txt")
    return "Done."


def oracle_reply(prompt_text: str) -> str:
    return expert_reply(prompt_text, perfect=True)


_WRITE = re.compile(r"echo\s+((?:the\s+word\s+)?)(\w+)\s*>\s*out\.txt")


def written(completion_text: str) -> tuple[str, str] | None:
    """(form, word) of a completion's `echo [the word] WORD > out.txt` (any CLI's call format; form "literal" or
    "exact"), or None."""
    m = _WRITE.search(completion_text.replace('\\"', '"'))
    return ("literal" if m.group(1) else "exact", m.group(2)) if m else None
