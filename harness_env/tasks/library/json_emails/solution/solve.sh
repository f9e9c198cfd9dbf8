#!/bin/bash
set -eu
python3 -c "import json; u=json.load(open('users.json')); print('\\n'.join(sorted(x['email'] for x in u if x['active'])))" > emails.txt
