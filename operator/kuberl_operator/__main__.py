"""`python -m kuberl_operator operator|render ...` (the operator image's entry point)."""

import sys

from .cli import main

sys.exit(main())
