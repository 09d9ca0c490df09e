"""``python -m statetier.backend`` is the ``statetier`` command."""

import sys

from statetier.backend.cli import main

sys.exit(main())
