"""`python -m trainer.probe CONFIG.yaml [--set ...] [--out FILE.json]` (also `mmcurate probe`)."""

import sys

from trainer.probe.run import main

sys.exit(main())
