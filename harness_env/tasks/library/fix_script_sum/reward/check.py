import json
import subprocess
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
for n in (10, 7, 100):
    try:
        out = subprocess.run([sys.executable, "sum_to.py", str(n)], capture_output=True, text=True, timeout=10)
        scores[f"n={n}"] = float(out.stdout.strip() == str(n * (n + 1) // 2))
    except (OSError, subprocess.TimeoutExpired):
        scores[f"n={n}"] = 0.0
finish(scores)
