"""Makes the shared test helpers (jobs.py, labs.py, the CLI helpers) importable from every test folder."""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
