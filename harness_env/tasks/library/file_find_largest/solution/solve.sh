#!/bin/bash
set -eu
ls -S data | head -n1 > largest.txt
