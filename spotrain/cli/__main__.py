"""`python -m spotrain.cli ...`: the command line, as the `spotrain` script runs it."""

import sys

from spotrain.cli import main

sys.exit(main())
