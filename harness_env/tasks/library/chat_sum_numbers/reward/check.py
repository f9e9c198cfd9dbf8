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


payload = json.loads(os.environ.get("OPENCLAW_REWARD_PAYLOAD", "{}"))
words = (payload.get("final_message") or "").replace(",", " ").split()
finish({"answer": float(bool(words) and words[-1].strip(".") == "45")})
