import json
import os
import sys


def finish(scores):
    """Prints the sub-scores, then their mean as the reward (the last line)."""
    print(json.dumps({"sub_scores": scores}))
    print(f"{sum(scores.values()) / len(scores):.4f}")
    sys.exit(0)


def read(path):
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return None


with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "expected.json")) as f:
    want = json.load(f)
try:
    got = json.loads(read("totals.json") or "")
except ValueError:
    got = None
ok = isinstance(got, dict) and set(got) == set(want) and all(
    isinstance(got[k], (int, float)) and abs(got[k] - v) < 1e-6 for k, v in want.items())
finish({"totals": float(ok)})
