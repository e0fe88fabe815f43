"""``python -m pytriton``: same as the ``pytriton`` command.

Unit test: tests/unit/test_cli.py (``python -m pytriton --version``).
"""

import sys

from pytriton._cli import main

sys.exit(main())
