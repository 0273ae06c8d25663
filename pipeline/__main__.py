import sys

from mmcurate.pipeline.cli import main

sys.exit(main())
