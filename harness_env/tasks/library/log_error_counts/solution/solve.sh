#!/bin/bash
set -eu
awk '$3=="ERROR"{c[$4]++} END{printf "{"; s=""; for(k in c){printf "%s\"%s\": %d", s, k, c[k]; s=", "} print "}"}' app.log > errors.json
