#!/bin/bash
# Runs after the harness exited, from <workspace>/reward (a fresh copy). Last line: the reward in [0, 1].
set -u
cd "$(dirname "$0")/.." || exit 1
exec python3 reward/check.py
