"""``python -m agiledart.cli``: the ``agiledart`` command."""

import sys

from agiledart.cli.entry import main

sys.exit(main())
