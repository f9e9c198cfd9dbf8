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


got = (read("adults.csv") or "").strip().splitlines()
want = ["name,age", "ana,34", "cai,30", "eve,51"]
finish({"header": float(got[:1] == want[:1]), "rows": float(got == want)})
