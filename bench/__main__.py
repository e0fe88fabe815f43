"""``python -m bench`` (``make bench``): the full benchmark, bench/suite.py; ``--help`` lists its options.

Only the entry point: the scenarios live in bench/suite.py and the helpers they share in
bench/_common.py, so that no module imports this one.
"""

import sys

from bench.suite import main

if __name__ == "__main__":
    sys.exit(main())
