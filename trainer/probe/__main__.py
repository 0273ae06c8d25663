"""`python -m mmcurate.trainer.probe CONFIG.yaml [--set ...] [--out FILE.json]`:
`mmcurate probe`."""

import sys

from mmcurate.trainer.probe.run import main

sys.exit(main())
