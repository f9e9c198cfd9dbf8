#!/bin/bash
set -eu
wc -w < essay.txt | tr -d ' ' > count.txt
