import sys
from pathlib import Path

# bench/ is a folder of scripts run from the repository root, not an installed package.
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
