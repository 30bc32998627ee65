"""``python -m dcoded.predict``: see :mod:`dcoded.predict.cli`."""

import sys

from dcoded.predict.cli import main

sys.exit(main())
