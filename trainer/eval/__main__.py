"""`python -m mmcurate.trainer.eval CONFIG.yaml [--set key.path=value ...]`:
`mmcurate eval`."""

import sys

from mmcurate.trainer.eval.evaluate import main

sys.exit(main())
