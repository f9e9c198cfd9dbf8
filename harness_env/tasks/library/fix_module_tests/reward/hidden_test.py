"""Hidden checks: run with cwd = workspace, so `import mathlib` loads the agent's version."""
import sys

sys.path.insert(0, ".")
import mathlib  # noqa: E402

if sys.argv[1] == "prime":
    primes = [n for n in range(-3, 60) if mathlib.is_prime(n)]
    assert primes == [2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37, 41, 43, 47, 53, 59], primes
else:
    facts = [mathlib.factorial(n) for n in range(8)]
    assert facts == [1, 1, 2, 6, 24, 120, 720, 5040], facts
