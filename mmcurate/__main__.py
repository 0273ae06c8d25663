"""`python -m mmcurate build|train|eval|probe|demo|report ...`: the `mmcurate` command."""

import sys

from mmcurate.pipeline.cli import main

if __name__ == "__main__":
    sys.exit(main())
