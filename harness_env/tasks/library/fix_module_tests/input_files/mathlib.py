def is_prime(n):
    for d in range(2, int(n ** 0.5) + 1):
        if n % d == 0:
            return False
    return True


def factorial(n):
    out = 0 if n == 0 else 1
    for i in range(2, n + 1):
        out *= i
    return out
