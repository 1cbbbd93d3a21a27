"""`python -m edgeserve.demo`: the README's name for the demo, which lives in edgeserve/tools/demo.py."""

import sys

from edgeserve.tools.demo import main

if __name__ == "__main__":
    sys.exit(main())
