"""The desktop family's checker (copied as reward/check.py): the files the apps saved vs reward/expected.json.

Runs in the verifier's fresh sandbox, from reward/ inside the final workspace, with the system python (stdlib
only). It reads only what the applications wrote to the workspace - a text file Mousepad saved, the folders and
files PCManFM created, moved or deleted, a workbook Gnumeric saved (gzip'd XML) - never anything the agent says.
Each check is 0/1 and becomes a sub-score; the reward is 1.0 when every check holds, else 0.0 (first stdout line
the sub-scores as JSON, last line the reward, as harness_env/web/check.py prints them).

Check kinds: `text` (the file's text equals, line endings and trailing newlines ignored), `absent`, `isdir`,
`sha256` (a file's bytes, for copies and moves), `entries` (the exact names in a folder; the workspace root
never counts reward/), `cells` (a Gnumeric workbook's cells: `equals` a cell's text, or `formula` a regex its
formula must match, spaces removed, case ignored).
"""

import gzip
import hashlib
import json
import os
import re
import sys
import xml.etree.ElementTree as ET

HERE = os.path.dirname(os.path.abspath(__file__))
WORKSPACE = os.path.dirname(HERE)


def path_of(rel):
    full = os.path.normpath(os.path.join(WORKSPACE, rel))
    if full != WORKSPACE and not full.startswith(WORKSPACE + os.sep):
        raise ValueError(f"{rel!r} leaves the workspace")
    return full


def norm_text(text):
    return text.replace("\r\n", "\n").rstrip("\n")


def cell_ref(col, row):
    letters, col = "", col + 1
    while col:
        col, r = divmod(col - 1, 26)
        letters = chr(65 + r) + letters
    return f"{letters}{row + 1}"


def gnumeric_cells(path):
    """{"A1": text} of the first sheet of a .gnumeric workbook (gzip'd or plain XML)."""
    with open(path, "rb") as fh:
        raw = fh.read()
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    root = ET.fromstring(raw)
    cells = {}
    for el in root.iter():
        if el.tag.endswith("}Sheet"):
            for cell in el.iter():
                if cell.tag.endswith("}Cell"):
                    cells[cell_ref(int(cell.get("Col")), int(cell.get("Row")))] = cell.text or ""
            break
    return cells


def holds(check):
    kind, full = check["kind"], path_of(check["path"])
    if kind == "absent":
        return not os.path.lexists(full)
    if kind == "isdir":
        return os.path.isdir(full) and not os.path.islink(full)
    if kind == "entries":
        names = set(os.listdir(full)) - ({"reward"} if full == WORKSPACE else set())
        return sorted(names) == sorted(check["names"])
    if os.path.islink(full) or not os.path.isfile(full):
        return False
    if kind == "text":
        with open(full, encoding="utf-8", errors="replace") as fh:
            return norm_text(fh.read()) == norm_text(check["equals"])
    if kind == "sha256":
        with open(full, "rb") as fh:
            return hashlib.sha256(fh.read()).hexdigest() == check["sha256"]
    if kind == "cells":
        cells = gnumeric_cells(full)
        for ref, want in check["cells"].items():
            got = cells.get(ref)
            if got is None:
                return False
            if "equals" in want and got.strip() != want["equals"]:
                return False
            if "formula" in want and not re.fullmatch(want["formula"], got.replace(" ", ""), re.IGNORECASE):
                return False
        extra = check.get("only")
        return extra is None or sorted(cells) == sorted(extra)
    raise ValueError(f"unknown check kind {kind!r}")


def main():
    with open(os.path.join(HERE, "expected.json")) as fh:
        checks = json.load(fh)["checks"]
    subs = {}
    for i, c in enumerate(checks):
        try:
            ok = holds(c)
        except (OSError, ValueError, ET.ParseError, EOFError) as e:  # a missing or unreadable file: 0, never an error
            print(f"check {i}: {type(e).__name__}: {e}", file=sys.stderr)
            ok = False
        subs[f"{i}:{c['kind']}:{c['path']}"] = float(ok)
    print(json.dumps({"sub_scores": subs}))
    print("1.0" if subs and all(v == 1.0 for v in subs.values()) else "0.0")


if __name__ == "__main__":
    main()
