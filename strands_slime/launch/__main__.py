"""``python3 -m strands_slime.launch``: check and plan this node's training launch (see :mod:`.plan`)."""

import sys

from strands_slime.launch.plan import main

sys.exit(main())
