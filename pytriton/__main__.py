"""``python -m pytriton``: same as the ``pytriton`` command."""

import sys

from pytriton._cli import main

sys.exit(main())
