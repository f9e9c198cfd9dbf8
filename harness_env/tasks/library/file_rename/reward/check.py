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


want = "# Plan\n\n1. Write the draft.\n2. Review it.\n"
renamed = read("final.md") == want
finish({"renamed": float(renamed), "old_gone": float(renamed and not os.path.exists("draft.md"))})
