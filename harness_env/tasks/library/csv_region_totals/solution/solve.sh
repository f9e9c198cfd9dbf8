#!/bin/bash
set -eu
python3 - <<'EOF'
import csv, json
t = {}
for row in csv.DictReader(open("sales.csv")):
    t[row["region"]] = t.get(row["region"], 0.0) + float(row["amount"])
json.dump(t, open("totals.json", "w"))
EOF
