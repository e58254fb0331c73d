"""`python -m agent.cli`: the `topolet` command."""

import sys

from agent.cli import main

sys.exit(main())
