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


want = "The color of the sky.\nMy favourite color is blue; colors fade.\nColour me impressed.\n"
finish({"content": float(read("doc.txt") == want)})
