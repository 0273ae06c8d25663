"""`python -m trainer.eval CONFIG.yaml [--set key.path=value ...]` (also `mmcurate eval`)."""

import sys

from trainer.eval.evaluate import main

sys.exit(main())
