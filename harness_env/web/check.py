"""The web family's checker (copied as reward/check.py): the app's server-side state vs expected.json.

Runs in the verifier's fresh sandbox from the fresh reward/ dir, where the runner put the app's state
(`env_state/state.json`, written by the app in its own sandbox: the agent could only change it by using
the site). Every check compares the value at a dotted path under the state's `data` with the expected
value exactly (after JSON normalisation); the reward is 1.0 when all hold, else 0.0, with one sub-score
per check. No state (the app never started, or wrote nothing) is 0.0, never an error.
"""

import json
import os
import sys


def at(data, path):
    for key in path.split("."):
        if not isinstance(data, dict) or key not in data:
            return None
        data = data[key]
    return data


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    with open(os.path.join(here, "expected.json")) as fh:
        checks = json.load(fh)["checks"]
    try:
        with open(os.path.join(here, "env_state", "state.json")) as fh:
            data = json.load(fh).get("data", {})
    except (OSError, ValueError, AttributeError) as e:
        print(f"no app state: {e}", file=sys.stderr)
        data = {}
    subs = {}
    for i, c in enumerate(checks):
        got = at(data, c["path"])
        subs[f"{i}:{c['path']}"] = float(json.dumps(got, sort_keys=True) == json.dumps(c["equals"], sort_keys=True))
    print(json.dumps({"sub_scores": subs}))
    print("1.0" if subs and all(v == 1.0 for v in subs.values()) else "0.0")


if __name__ == "__main__":
    main()
