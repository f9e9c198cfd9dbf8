import json
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


# The answer lives in the checker, not in a data file of reward/ an output could link to (synth.py rewrites it).
EXPECTED = {"north": 12.75, "south": 5.75, "east": 7.0}
want = EXPECTED
try:
    got = json.loads(read("totals.json") or "")
except ValueError:
    got = None
ok = isinstance(got, dict) and set(got) == set(want) and all(
    isinstance(got[k], (int, float)) and abs(got[k] - v) < 1e-6 for k, v in want.items())
finish({"totals": float(ok)})
