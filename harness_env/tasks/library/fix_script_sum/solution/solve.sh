#!/bin/bash
set -eu
sed -i 's/range(1, n)/range(1, n + 1)/' sum_to.py
