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


scores = {}
for name, folder in [("a.jpg", "images"), ("b.png", "images"), ("notes.txt", "text"), ("todo.txt", "text")]:
    scores[name] = float(os.path.isfile(os.path.join(folder, name)) and not os.path.exists(name))
scores["report.pdf"] = float(os.path.isfile("report.pdf"))
finish(scores)
