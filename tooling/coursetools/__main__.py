"""``python -m coursetools VERB``: the course tooling's command line."""

import sys

from coursetools.cli import main

sys.exit(main())
