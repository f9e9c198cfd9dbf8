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



def returned(stdout, case):
    """What the hidden test printed last for `case` (the values the agent's functions returned), else None."""
    try:
        last = json.loads(stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return None
    return last.get("got") if isinstance(last, dict) and last.get("case") == case else None


# The agent's module runs with this checker's rights, so its exit status is never trusted: only the values
# its functions returned, compared here, in this process (metadata.agent_code_guard).
WANT = {"prime": [2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37, 41, 43, 47, 53, 59],
        "factorial": [1, 1, 2, 6, 24, 120, 720, 5040]}
hidden = os.path.join(os.path.dirname(os.path.abspath(__file__)), "hidden_test.py")
scores = {}
for case, want in WANT.items():
    try:
        out = subprocess.run([sys.executable, hidden, case], capture_output=True, text=True, timeout=10)
        scores[case] = float(returned(out.stdout, case) == want)
    except (OSError, subprocess.TimeoutExpired):
        scores[case] = 0.0
finish(scores)
