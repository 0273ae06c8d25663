"""`python -m mmcurate.trainer CONFIG.yaml [--set key.path=value ...]`."""

import sys

from mmcurate.trainer.cli import main

sys.exit(main())
