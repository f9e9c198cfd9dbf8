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
    got = json.loads(read("merged.json") or "")
except ValueError:
    got = None
WANT = {
    "server": {"host": "localhost", "port": 9090, "tls": {"enabled": True, "cert": "c.pem"}},
    "debug": True,
    "tags": ["a"],
}
finish({"merged": float(got == WANT)})
