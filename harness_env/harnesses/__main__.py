"""`python -m harness_env.harnesses [NAME ...]`: install the pinned npm harnesses (all by default)."""

import sys

from harness_env.harnesses.install import main

sys.exit(main())
