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

import pathlib
import random
from collections.abc import Callable

from harness_env.tasks.templated import held_out, pairs, round_robin
from harness_env.tasks.web_family import START, eq, pick, site, write_site_task

CATEGORY = "visual"
COLOURS = {"red": "#d62728", "green": "#2ca02c", "blue": "#1f77b4", "yellow": "#f2c80f", "purple": "#9467bd",
           "orange": "#ff7f0e", "pink": "#f78fb3", "black": "#222222"}
LIGHTS = {"red": "#e5342b", "green": "#2fb344", "amber": "#f5a623"}
SHAPES = ("star", "heart", "circle", "triangle", "square", "diamond")
HOSTS = ("web", "db", "cache", "queue", "auth", "mail", "search", "api")


def choose_one(rng, kind: str, title: str, items: str, config: list[dict], what: str, described: list[str]) -> dict:
    """A page of cards `what` 1..N (config[items], drawn); the task names card k by `described[k]` only; the
    plausible mistake chooses another card."""
    k = rng.randrange(len(config))
    other = rng.choice([j for j in range(len(config)) if j != k])
    click = lambda j: [("goto", "/"), ("click", "button", f"Choose {what} {j + 1}")]  # noqa: E731
    q = f"On {START}/, choose the {described[k]} (exactly one choice)."
    return dict(site=site(kind, title, {items: config}, {"chosen": []}), query=q, checks=[eq("chosen", [k + 1])],
                plan=click(k), wrong=click(other))


def t_pick_colour(rng):
    names = pick(rng, sorted(COLOURS), 6)
    swatches = [{"id": i + 1, "rgb": COLOURS[c]} for i, c in enumerate(names)]
    return choose_one(rng, "palette", "Colour Picker", "swatches", swatches, "swatch", [f"{c} swatch" for c in names])


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
    return choose_one(rng, "icons", "Icon Board", "icons", icons, "icon", [f"icon shaped like a {sh}" for sh in shapes])


TEMPLATES: dict[str, Callable[[random.Random], dict]] = {
    "pick_colour": t_pick_colour,
    "restart_red": t_restart_red,
    "pick_icon": t_pick_icon,
}


def split_of(template: str, index: int) -> str:
    return held_out("visual", template, index)


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
    return pairs(TEMPLATES, split_of, split, per_template)


def generate(out_dir: str | pathlib.Path, split: str = "train", n: int | None = None, seed: int = 0,
             per_template: int = 20) -> list[pathlib.Path]:
    """n tasks of `split` (all when None) over `per_template` variants of each template, round-robin."""
    order = round_robin(variants(split, per_template), seed, per_template)
    return [write_task(out_dir, t, i) for t, i in order[: n if n is not None else len(order)]]
