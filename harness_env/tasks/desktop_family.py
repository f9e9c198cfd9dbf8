"""The desktop task family: 13 templates of chores in real Debian desktop apps, seeded variants, held-out split.

Each task is a ClawGym-format folder: `input_files/` (the workspace the apps open), `reward/` (check.py from
harness_env/desktop/check.py + expected.json: the checker reads only the files the apps saved), `solution/plan.json`
(the reference solution as GUI actions: keys, typed text, window syncs, run through harness_env/desktop/plan.py
against the live apps) and `solution/wrong_plan.json` (a plausible mistake, which must score 0.0). The metadata's
`desktop` entry says which apps the per-task desktop starts (harness_env/desktop/session.py, in the rollout's own
sandbox) and at what screen size; `launch`-side code builds `App`s from it with `apps_of`.

Templates: Mousepad (write and save as, replace a word, append a line, delete a line, insert a header line),
PCManFM (new folder, rename, delete, move, copy), Galculator with Mousepad (compute, paste the result, save:
Galculator saves no result of its own - its only file is its config - so the checked state is the file Mousepad
saved), Gnumeric (enter a column and save as .gnumeric, enter values plus a SUM formula). A variant is
(template, index), a pure function of both; every 5th index of each template is held out, at a per-template
hashed offset, so every template is in both splits and held-out success measures the skill on unseen data.
"""

from __future__ import annotations

import hashlib
import json
import pathlib
import random
import shutil
from collections.abc import Callable

from harness_env.desktop import plan as p
from harness_env.desktop.session import App
from harness_env.tasks.loader import new_task_dir
from harness_env.tasks.templated import held_out, pairs, round_robin

CATEGORY = "desktop"
SIZE = (1024, 768)
CHECK_PY = pathlib.Path(__file__).resolve().parents[1] / "desktop" / "check.py"
WS = "{workspace}"  # the sandbox's workspace path, filled in by plan.run_step and apps_of

WORDS = ("apple", "river", "cloud", "stone", "tiger", "piano", "lemon", "candle", "forest", "silver", "garden",
         "planet", "winter", "yellow", "rocket", "violin", "coffee", "harbor", "meadow", "copper")
NAMES = ("notes", "todo", "draft", "report", "memo", "ideas", "journal", "summary", "plan", "letter")
FOLDERS = ("archive", "photos", "invoices", "projects", "music", "backup", "drafts", "travel", "recipes", "old")

APPS = {
    "mousepad": {"argv": ["mousepad"], "wm_class": "Mousepad", "package": "mousepad"},
    "pcmanfm": {"argv": ["pcmanfm", WS], "wm_class": "Pcmanfm", "package": "pcmanfm"},
    "galculator": {"argv": ["galculator"], "wm_class": "Galculator", "package": "galculator"},
    "gnumeric": {"argv": ["gnumeric"], "wm_class": "Gnumeric", "package": "gnumeric", "timeout_s": 60.0},
}


def app(name: str, *args: str) -> dict:
    spec = dict(APPS[name])
    return {"name": name, **spec, "argv": spec["argv"] + list(args)}


def apps_of(specs: list[dict], workspace: str) -> list[App]:
    """The task's app specs (metadata.desktop.apps) as session Apps, `{workspace}` filled in."""
    return [App(name=s["name"], argv=tuple(a.replace(WS, workspace) for a in s["argv"]), wm_class=s["wm_class"],
                package=s.get("package", ""), timeout_s=s.get("timeout_s", 30.0)) for s in specs]


def sentence(rng: random.Random, n: int, avoid: tuple[str, ...] = ()) -> str:
    return " ".join(rng.choice([w for w in WORDS if w not in avoid]) for _ in range(n))


def text_check(rel: str, text: str) -> dict:
    return {"kind": "text", "path": rel, "equals": text}


# --- Mousepad: the plans edit through the keyboard and save with ctrl+s, then wait for the saved title ----------
def mp_title(rel: str, modified: bool = False) -> str:
    return p.exact_title(("*" if modified else "") + f"{WS}/{rel} - Mousepad")


def mp_save(rel: str) -> list[dict]:
    return [p.key("ctrl+s"), p.wait_window(mp_title(rel))]


def save_dialog(path: str, title: str) -> list[dict]:
    """A GTK save dialog: select the proposed name, type the full path, let the completion popup settle, save."""
    return [p.wait_window(title), p.key("ctrl+a"), p.type_(path), p.sleep(0.6), p.key("Return")]


def t_mp_write_new(rng):
    name = f"{rng.choice(NAMES)}-{rng.randint(10, 99)}.txt"
    lines = [sentence(rng, rng.randint(3, 6)) for _ in range(rng.randint(2, 3))]
    text = "\n".join(lines)

    def write(target):
        return [p.wait_window("Mousepad"), p.type_(text), p.key("ctrl+s"),
                *save_dialog(f"{WS}/{target}", "Save As"), p.wait_window(mp_title(target))]

    q = f"In Mousepad, write exactly these {len(lines)} lines and save them as {name} in the workspace:\n" + text
    return dict(apps=[app("mousepad")], inputs={}, query=q, plan=write(name), wrong=write(name.removesuffix(".txt")),
                checks=[text_check(name, text)])


def t_mp_replace(rng):
    name = f"{rng.choice(NAMES)}.txt"
    old, new = rng.sample(WORDS, 2)
    lines = [sentence(rng, 5, (old, new)).split() for _ in range(3)]
    for i in rng.sample(range(3), 2):  # the word on two lines, so "the first one only" is a real mistake
        lines[i].insert(rng.randint(0, 5), old)
    before = "\n".join(" ".join(words) for words in lines)
    after = before.replace(old, new)
    first_only = before.replace(old, new, 1)

    def retype(text):  # select everything, type the edited text, save
        return [p.wait_window(mp_title(name)), p.key("ctrl+a"), p.type_(text), *mp_save(name)]

    q = f'In Mousepad (already open on {name}), replace every occurrence of the word "{old}" with "{new}" and save.'
    return dict(apps=[app("mousepad", f"{WS}/{name}")], inputs={name: before + "\n"}, query=q, plan=retype(after),
                wrong=retype(first_only), checks=[text_check(name, after)])


def t_mp_append(rng):
    name = f"{rng.choice(NAMES)}.txt"
    lines = [sentence(rng, 4) for _ in range(rng.randint(2, 4))]
    extra = f"{rng.choice(WORDS)} {rng.randint(100, 999)}"
    before = "\n".join(lines)

    def add(where, text):
        return [p.wait_window(mp_title(name)), p.key(where), p.type_(text), *mp_save(name)]

    q = f'In Mousepad (already open on {name}), add a new last line "{extra}" at the end of the file and save.'
    return dict(apps=[app("mousepad", f"{WS}/{name}")], inputs={name: before}, query=q,
                plan=add("ctrl+End", "\n" + extra), wrong=add("ctrl+Home", extra + "\n"),
                checks=[text_check(name, before + "\n" + extra)])


def t_mp_delete_line(rng):
    name = f"{rng.choice(NAMES)}.txt"
    lines = [f"{i + 1}. {sentence(rng, 3)}" for i in range(rng.randint(4, 6))]
    k = rng.randrange(1, len(lines))  # never the first line, so the mistake (the line above) exists
    before = "\n".join(lines) + "\n"

    def delete(i):
        return [p.wait_window(mp_title(name)), p.key("ctrl+Home", *["Down"] * i, "shift+Down", "Delete"),
                *mp_save(name)]

    q = f'In Mousepad (already open on {name}), delete the line "{lines[k]}" (the whole line) and save.'
    return dict(apps=[app("mousepad", f"{WS}/{name}")], inputs={name: before}, query=q, plan=delete(k),
                wrong=delete(k - 1), checks=[text_check(name, "\n".join(lines[:k] + lines[k + 1:]))])


def t_mp_header(rng):
    name = f"{rng.choice(NAMES)}.txt"
    body = "\n".join(sentence(rng, 4) for _ in range(3))
    header = f"# {rng.choice(NAMES).title()} {rng.randint(2020, 2030)}"
    q = f'In Mousepad (already open on {name}), insert "{header}" as a new first line above the text and save.'
    edit = [p.wait_window(mp_title(name)), p.key("ctrl+Home"), p.type_(header + "\n")]
    return dict(apps=[app("mousepad", f"{WS}/{name}")], inputs={name: body + "\n"}, query=q,
                plan=edit + mp_save(name), wrong=edit + [p.wait_window(mp_title(name, modified=True))],  # never saved
                checks=[text_check(name, header + "\n" + body)])


# --- PCManFM: select by type-ahead, act with its shortcuts, wait for the file system to show the result ----------
def fm_files(rng: random.Random, n: int) -> dict[str, str]:
    names = rng.sample([f"{w}.txt" for w in WORDS], n)
    return {f: f"{f} {rng.randint(1000, 9999)}\n" for f in names}


def fm_select(name: str) -> list[dict]:
    return [p.type_(name), p.sleep(0.4), p.key("Escape"), p.sleep(0.2)]


FM_READY = p.wait_window("^workspace$")


def sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def t_fm_new_folder(rng):
    files = fm_files(rng, 3)
    folder = f"{rng.choice(FOLDERS)}-{rng.randint(2020, 2030)}"

    def make(n):
        return [FM_READY, p.key("ctrl+shift+n"), p.wait_window("Creating New Folder"), p.key("ctrl+a"), p.type_(n),
                p.key("Return"), p.wait_file(f"{WS}/{n}")]

    q = f'In the file manager (PCManFM, open on the workspace), create a new folder named "{folder}".'
    return dict(apps=[app("pcmanfm")], inputs=files, query=q, plan=make(folder), wrong=make(folder.title()),
                checks=[{"kind": "isdir", "path": folder}, {"kind": "entries", "path": ".",
                                                            "names": sorted([*files, folder])}])


def t_fm_rename(rng):
    files = fm_files(rng, 3)
    src, other = rng.sample(sorted(files), 2)
    dst = f"{rng.choice(NAMES)}-{rng.randint(10, 99)}.txt"

    def rename(f):
        return [FM_READY, *fm_select(f), p.key("F2"), p.wait_window("Rename File"), p.key("ctrl+a"), p.type_(dst),
                p.key("Return"), p.wait_file(f"{WS}/{dst}")]

    q = f'In the file manager (PCManFM, open on the workspace), rename the file "{src}" to "{dst}".'
    return dict(apps=[app("pcmanfm")], inputs=files, query=q, plan=rename(src), wrong=rename(other),
                checks=[{"kind": "sha256", "path": dst, "sha256": sha(files[src])}, {"kind": "absent", "path": src},
                        {"kind": "entries", "path": ".", "names": sorted({*files, dst} - {src})}])


def t_fm_delete(rng):
    files = fm_files(rng, 4)
    target, other = rng.sample(sorted(files), 2)

    def delete(f):
        return [FM_READY, *fm_select(f), p.key("shift+Delete"), p.wait_window("^Confirm$"), p.key("Return"),
                p.wait_file(f"{WS}/{f}", gone=True)]

    q = f'In the file manager (PCManFM, open on the workspace), delete the file "{target}" (only that one).'
    return dict(apps=[app("pcmanfm")], inputs=files, query=q, plan=delete(target), wrong=delete(other),
                checks=[{"kind": "entries", "path": ".", "names": sorted(set(files) - {target})}])


def fm_transfer(rng, move: bool):
    files = fm_files(rng, 3)
    folder = rng.choice(FOLDERS)
    target = rng.choice(sorted(files))

    def transfer(shortcut):
        return [FM_READY, *fm_select(target), p.key(shortcut), *fm_select(folder), p.key("Return"),
                p.wait_window(f"^{folder}$"), p.key("ctrl+v"), p.wait_file(f"{WS}/{folder}/{target}")]

    right, mistaken = ("ctrl+x", "ctrl+c") if move else ("ctrl+c", "ctrl+x")
    top = sorted(set(files) - {target}) + [folder] if move else sorted([*files, folder])
    verb = "move" if move else "copy"
    q = (f'In the file manager (PCManFM, open on the workspace), {verb} the file "{target}" into the folder '
         f'"{folder}"{"" if move else " (keep the original where it is)"}.')
    return dict(apps=[app("pcmanfm")], inputs={**files, f"{folder}/.keep": ""}, query=q, plan=transfer(right),
                wrong=transfer(mistaken),
                checks=[{"kind": "sha256", "path": f"{folder}/{target}", "sha256": sha(files[target])},
                        {"kind": "entries", "path": ".", "names": sorted(top)}])


def t_fm_move(rng):
    return fm_transfer(rng, move=True)


def t_fm_copy(rng):
    return fm_transfer(rng, move=False)


CALC_KEYS = {"(": "parenleft", ")": "parenright", "+": "KP_Add", "-": "KP_Subtract", "*": "KP_Multiply",
             "/": "KP_Divide"}


# --- Galculator + Mousepad -------------------------------------------------------------------------------------
def t_calc_to_file(rng):
    a, b, c = rng.randint(11, 99), rng.randint(11, 99), rng.randint(3, 19)
    op = rng.choice(["+", "-"])
    value = (a + b) * c if op == "+" else (a - b) * c
    name = f"result-{rng.randint(10, 99)}.txt"

    def compute(expr):  # key by key, 250 ms apart: Galculator ignores a button's key while that button still
        keys = [CALC_KEYS.get(ch, ch) for ch in expr]  # shows pressed (the second 6 of "46+65" was lost at 40 ms)
        return [p.activate("galculator"), p.key(*keys, delay_ms=250), p.key("Return"), p.sleep(0.3), p.key("ctrl+c"),
                p.activate(mp_title(name)), p.key("ctrl+v"), *mp_save(name)]

    q = (f"Use the calculator (Galculator) to compute ({a} {op} {b}) * {c}, then put the result (digits only) into "
         f"{name}, which is open in Mousepad, and save it.")
    return dict(apps=[app("mousepad", f"{WS}/{name}"), app("galculator")], inputs={name: ""}, query=q,
                plan=compute(f"({a}{op}{b})*{c}"), wrong=compute(f"{a}{op}{b}*{c}"),  # the parentheses forgotten
                checks=[text_check(name, str(value))])


# --- Gnumeric: type into cells (Return moves down), save through its GTK dialog as native .gnumeric ------------
def gn_save(path: str, name: str) -> list[dict]:
    return [p.key("ctrl+s"), *save_dialog(path, "Save the current workbook as"), p.wait_file(path),
            p.wait_window(p.exact_title(f"{name} - Gnumeric"))]


def t_gn_column(rng):
    values = [str(rng.randint(1, 999)) for _ in range(rng.randint(3, 5))]
    name = f"{rng.choice(NAMES)}-{rng.randint(10, 99)}.gnumeric"
    path = f"{WS}/{name}"
    q = (f"In the spreadsheet (Gnumeric), enter the numbers {', '.join(values)} into cells A1 to A{len(values)} "
         f"(one per cell, top to bottom) and save the workbook as {name} in the workspace (Gnumeric format).")
    down = "".join(v + "\n" for v in values)
    across = "\t".join(values) + "\n"  # the mistake: one row instead of one column
    cells = {f"A{i + 1}": {"equals": v} for i, v in enumerate(values)}
    return dict(apps=[app("gnumeric")], inputs={}, query=q, plan=[p.wait_window("Gnumeric"), p.type_(down),
                *gn_save(path, name)], wrong=[p.wait_window("Gnumeric"), p.type_(across), *gn_save(path, name)],
                checks=[{"kind": "cells", "path": name, "cells": cells, "only": sorted(cells)}])


def t_gn_sum(rng):
    values = [str(rng.randint(1, 500)) for _ in range(rng.randint(3, 5))]
    n = len(values)
    name = f"{rng.choice(NAMES)}-sum.gnumeric"
    path = f"{WS}/{name}"
    q = (f"In the spreadsheet (Gnumeric), enter {', '.join(values)} into A1 to A{n}, put a formula in A{n + 1} that "
         f"adds them up (SUM of A1:A{n}), and save the workbook as {name} in the workspace (Gnumeric format).")

    def sheet(last):
        return [p.wait_window("Gnumeric"), p.type_("".join(v + "\n" for v in values) + f"=SUM(A1:A{last})\n"),
                *gn_save(path, name)]

    cells = {f"A{i + 1}": {"equals": v} for i, v in enumerate(values)}
    cells[f"A{n + 1}"] = {"formula": rf"=SUM\(A1:A{n}\)"}
    return dict(apps=[app("gnumeric")], inputs={}, query=q, plan=sheet(n), wrong=sheet(n - 1),  # one row short
                checks=[{"kind": "cells", "path": name, "cells": cells}])


TEMPLATES: dict[str, Callable[[random.Random], dict]] = {
    "mousepad_write_new": t_mp_write_new,
    "mousepad_replace_word": t_mp_replace,
    "mousepad_append_line": t_mp_append,
    "mousepad_delete_line": t_mp_delete_line,
    "mousepad_insert_header": t_mp_header,
    "pcmanfm_new_folder": t_fm_new_folder,
    "pcmanfm_rename": t_fm_rename,
    "pcmanfm_delete": t_fm_delete,
    "pcmanfm_move": t_fm_move,
    "pcmanfm_copy": t_fm_copy,
    "galculator_to_file": t_calc_to_file,
    "gnumeric_column": t_gn_column,
    "gnumeric_sum": t_gn_sum,
}


def split_of(template: str, index: int) -> str:
    """Every 5th variant index of a template is held out, at a per-template offset (a stable hash)."""
    return held_out("desktop", template, index)


def variant(template: str, index: int) -> dict:
    """The task of (template, index): a pure function of both (its own seeded RNG)."""
    if template not in TEMPLATES:
        raise ValueError(f"unknown desktop template {template!r}; known: {sorted(TEMPLATES)}")
    return TEMPLATES[template](random.Random(f"desktop/{template}/{index}"))


def task_id(template: str, index: int) -> str:
    return f"desktop-{template}-{index:03d}"


def write_task(out_dir: str | pathlib.Path, template: str, index: int) -> pathlib.Path:
    v = variant(template, index)
    tid = task_id(template, index)
    d = new_task_dir(out_dir, tid, ("input_files", "reward", "solution"))
    entry = {"task_id": tid, "user_query": v["query"].replace(WS, "the workspace"),
             "metadata": {"category": CATEGORY, "template": template, "index": index,
                          "split": split_of(template, index), "desktop": {"apps": v["apps"], "size": list(SIZE)}}}
    (d / "data_entry.json").write_text(json.dumps(entry, indent=2) + "\n")
    for rel, text in v["inputs"].items():
        (d / "input_files" / rel).parent.mkdir(parents=True, exist_ok=True)
        (d / "input_files" / rel).write_text(text)
    shutil.copyfile(CHECK_PY, d / "reward" / "check.py")
    (d / "reward" / "expected.json").write_text(json.dumps({"checks": v["checks"]}, indent=1) + "\n")
    (d / "reward" / "reward.sh").write_text('#!/bin/bash\ncd "$(dirname "$0")" && exec /usr/bin/python3 -I check.py\n')
    (d / "reward" / "reward.sh").chmod(0o755)
    (d / "solution" / "plan.json").write_text(json.dumps(v["plan"], indent=1) + "\n")
    (d / "solution" / "wrong_plan.json").write_text(json.dumps(v["wrong"], indent=1) + "\n")
    return d


def variants(split: str, per_template: int) -> list[tuple[str, int]]:
    return pairs(TEMPLATES, split_of, split, per_template)


def generate(out_dir: str | pathlib.Path, split: str = "train", n: int | None = None, seed: int = 0,
             per_template: int = 10) -> list[pathlib.Path]:
    """Writes n tasks of `split` (all when None) from `per_template` variants of every template, shuffled by
    `seed`, round-robin over templates first so that a small n still covers them."""
    order = round_robin(variants(split, per_template), seed, per_template)
    return [write_task(out_dir, t, i) for t, i in order[: n if n is not None else len(order)]]
