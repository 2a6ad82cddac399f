"""Plan tests drive the real plan with tests/fake_device.py's device."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
