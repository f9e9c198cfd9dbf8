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
EXPECTED = "beta.log"
want = EXPECTED
got = (read("largest.txt") or "").strip()
finish({"answer": float(got in (want, "data/" + want))})
