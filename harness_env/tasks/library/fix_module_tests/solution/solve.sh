#!/bin/bash
set -eu
sed -i 's/^    for d in range(2/    if n < 2:\n        return False\n    for d in range(2/; s/out = 0 if n == 0 else 1/out = 1/' mathlib.py
