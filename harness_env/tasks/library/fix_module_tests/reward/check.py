import json
import os
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



hidden = os.path.join(os.path.dirname(os.path.abspath(__file__)), "hidden_test.py")
scores = {}
for case in ("prime", "factorial"):
    try:
        out = subprocess.run([sys.executable, hidden, case], capture_output=True, text=True, timeout=10)
        scores[case] = float(out.returncode == 0)
    except (OSError, subprocess.TimeoutExpired):
        scores[case] = 0.0
finish(scores)
