import mathlib

assert not mathlib.is_prime(1), "1 is not prime"
assert mathlib.is_prime(2) and mathlib.is_prime(13) and not mathlib.is_prime(15)
assert mathlib.factorial(0) == 1, "0! is 1"
assert mathlib.factorial(5) == 120
print("all tests passed")
