"""`python -m trainer CONFIG.yaml [--set key.path=value ...]`."""

import sys

from trainer.cli import main

sys.exit(main())
