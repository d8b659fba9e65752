"""``python -m hf_algos`` is the ``hybridflow`` command."""

import sys

from hf_algos.cli import main

sys.exit(main())
