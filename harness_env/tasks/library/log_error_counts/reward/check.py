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


try:
    got = json.loads(read("errors.json") or "")
except ValueError:
    got = None
finish({"counts": float(got == {"api": 3, "db": 1, "worker": 1})})
