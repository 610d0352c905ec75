#!/usr/bin/python3
"""tools/report.py: the command of pstrain_tools/report.py, which says what it does."""

import os
import sys

# The package beside this script, through the bin/ links to it too.
sys.path.insert(0, os.path.dirname(os.path.realpath(__file__)))
from pstrain_tools.report import main  # noqa: E402

sys.exit(main())
