#!/bin/bash
# Runs after the harness exited, cwd = the workspace. Last stdout line: the reward in [0, 1].
set -u
exec python3 "$(dirname "$0")/check.py"
