"""`python -m gqa_spec ...` is `gqa-spec ...`."""

import sys

from gqa_spec.cli import main

sys.exit(main())
