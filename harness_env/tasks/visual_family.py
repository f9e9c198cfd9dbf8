"""The visual web family: tasks whose answer is on the screen only (issue 26, items 7 and 8).

Same task format, site app and checker as the web family (harness_env/tasks/web_family.py), with kinds from
harness_env/web/webapp/visual.py: every control is named by position or name ("Choose swatch 3", "Restart
db-2"), and what tells the items apart (a colour, a status light, a shape) is drawn and hidden from the
accessibility tree. So an agent reading the accessibility text can only guess: with 6 items, 1 in 6 for a single
pick. A vision policy (`browser_use_vision`) sees it in the screenshot. Held out: every 5th variant of each
template, as in the web family.

    python -m harness_env.tasks visual --out DIR [--split heldout]   # or select_tasks("visual", ...)
"""

from __future__ import annotations

import hashlib
import pathlib
import random
from collections.abc import Callable

from harness_env.tasks.web_family import START, eq, pick, round_robin, site, write_site_task

CATEGORY = "visual"
COLOURS = {"red": "#d62728", "green": "#2ca02c", "blue": "#1f77b4", "yellow": "#f2c80f", "purple": "#9467bd",
           "orange": "#ff7f0e", "pink": "#f78fb3", "black": "#222222"}
LIGHTS = {"red": "#e5342b", "green": "#2fb344", "amber": "#f5a623"}
SHAPES = ("star", "heart", "circle", "triangle", "square", "diamond")
HOSTS = ("web", "db", "cache", "queue", "auth", "mail", "search", "api")


def t_pick_colour(rng):
    names = pick(rng, sorted(COLOURS), 6)
    swatches = [{"id": i + 1, "rgb": COLOURS[c]} for i, c in enumerate(names)]
    k = rng.randrange(6)
    other = rng.choice([j for j in range(6) if j != k])
    s = site("palette", "Colour Picker", {"swatches": swatches}, {"chosen": []})
    plan = [("goto", "/"), ("click", "button", f"Choose swatch {k + 1}")]
    wrong = [("goto", "/"), ("click", "button", f"Choose swatch {other + 1}")]
    q = f"On {START}/, choose the {names[k]} swatch (exactly one choice)."
    return dict(site=s, query=q, checks=[eq("chosen", [k + 1])], plan=plan, wrong=wrong)


def t_restart_red(rng):
    hosts = [f"{h}-{rng.randint(1, 9)}" for h in pick(rng, HOSTS, 6)]
    red = sorted(rng.sample(range(6), 2))
    rest = [i for i in range(6) if i not in red]
    amber = rng.choice(rest)
    state = ["red" if i in red else "amber" if i == amber else "green" for i in range(6)]
    servers = [{"id": i + 1, "name": h, "rgb": LIGHTS[st]} for i, (h, st) in enumerate(zip(hosts, state))]
    s = site("servers", "Ops Console", {"servers": servers}, {"restarted": []})
    plan = [("goto", "/"), *(("click", "button", f"Restart {hosts[i]}") for i in red)]
    wrong = [("goto", "/"), *(("click", "button", f"Restart {hosts[i]}") for i in (red[0], amber))]
    q = (f"On the ops console at {START}/, restart every server whose status light is red, and no other server "
         "(the lights are green, amber or red).")
    return dict(site=s, query=q, checks=[eq("restarted", [i + 1 for i in red])], plan=plan, wrong=wrong)


def t_pick_icon(rng):
    shapes = pick(rng, list(SHAPES), 6)
    icons = [{"id": i + 1, "shape": sh, "rgb": COLOURS[pick(rng, sorted(COLOURS))]} for i, sh in enumerate(shapes)]
    k = rng.randrange(6)
    other = rng.choice([j for j in range(6) if j != k])
    s = site("icons", "Icon Board", {"icons": icons}, {"chosen": []})
    plan = [("goto", "/"), ("click", "button", f"Choose icon {k + 1}")]
    wrong = [("goto", "/"), ("click", "button", f"Choose icon {other + 1}")]
    q = f"On {START}/, choose the icon shaped like a {shapes[k]} (exactly one choice)."
    return dict(site=s, query=q, checks=[eq("chosen", [k + 1])], plan=plan, wrong=wrong)


TEMPLATES: dict[str, Callable[[random.Random], dict]] = {
    "pick_colour": t_pick_colour,
    "restart_red": t_restart_red,
    "pick_icon": t_pick_icon,
}


def split_of(template: str, index: int) -> str:
    h = int(hashlib.sha256(f"visual/{template}".encode()).hexdigest()[:8], 16)
    return "heldout" if (h + index) % 5 == 0 else "train"


def variant(template: str, index: int) -> dict:
    if template not in TEMPLATES:
        raise ValueError(f"unknown visual template {template!r}; known: {sorted(TEMPLATES)}")
    return TEMPLATES[template](random.Random(f"visual/{template}/{index}"))


def task_id(template: str, index: int) -> str:
    return f"visual-{template}-{index:03d}"


def write_task(out_dir: str | pathlib.Path, template: str, index: int) -> pathlib.Path:
    meta = {"category": CATEGORY, "template": template, "index": index, "split": split_of(template, index)}
    return write_site_task(out_dir, task_id(template, index), variant(template, index), meta)


def variants(split: str, per_template: int) -> list[tuple[str, int]]:
    if split not in ("train", "heldout", "all"):
        raise ValueError(f"split {split!r} not in train|heldout|all")
    return [(t, i) for t in TEMPLATES for i in range(per_template) if split == "all" or split_of(t, i) == split]


def generate(out_dir: str | pathlib.Path, split: str = "train", n: int | None = None, seed: int = 0,
             per_template: int = 20) -> list[pathlib.Path]:
    """n tasks of `split` (all when None) over `per_template` variants of each template, round-robin."""
    order = round_robin(variants(split, per_template), seed, per_template)
    return [write_task(out_dir, t, i) for t, i in order[: n if n is not None else len(order)]]
