"""Hidden checks: run with cwd = workspace, so `import mathlib` loads the agent's version.

It prints what the agent's functions RETURN (one JSON line, last) and asserts nothing: check.py, in another
process, compares those values with its own. An exit status proves nothing (a module that calls `os._exit(0)`
at import exits 0 and used to score 1.0); values it did not compute cannot pass.
"""
import json
import sys

sys.path.insert(0, ".")
import mathlib  # noqa: E402

if sys.argv[1] == "prime":
    got = [n for n in range(-3, 60) if mathlib.is_prime(n)]
else:
    got = [mathlib.factorial(n) for n in range(8)]
print(json.dumps({"case": sys.argv[1], "got": got}))
