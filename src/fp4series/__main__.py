"""`python -m fp4series <command>`: the CLI in fp4series.cli."""

import sys

from fp4series.cli import main

sys.exit(main())
