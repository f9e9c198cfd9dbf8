#!/bin/bash
set -eu
awk -F, 'NR==1 || $2>=30' people.csv > adults.csv
