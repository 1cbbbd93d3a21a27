"""`python -m edgeserve.profiler` is `edgeserve-profile`."""

import sys

from edgeserve.profiler.cli import main

sys.exit(main())
