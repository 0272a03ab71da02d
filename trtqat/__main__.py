"""``python -m trtqat`` (also what ``torchrun -m trtqat`` runs)."""

import sys

from trtqat.cli import main

sys.exit(main())
