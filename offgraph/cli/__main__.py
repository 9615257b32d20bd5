"""`python -m offgraph.cli`: the same as the `offgraph` command."""

import sys

from offgraph.cli import main

sys.exit(main())
