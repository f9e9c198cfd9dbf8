#!/bin/bash
set -eu
python3 - <<'EOF'
import json
def deep(a, b):
    out = dict(a)
    for k, v in b.items():
        out[k] = deep(a[k], v) if isinstance(v, dict) and isinstance(a.get(k), dict) else v
    return out
json.dump(deep(json.load(open("base.json")), json.load(open("override.json"))), open("merged.json", "w"))
EOF
