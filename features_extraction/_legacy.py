"""Shared bits of the legacy converter wrappers: use the volta_ml of this checkout.

Run as `python features_extraction/<script>.py`; when the scripts sit in a source
checkout, its `volta_ml` wins over any other installed copy.
"""
from __future__ import annotations

import sys
from pathlib import Path

_ROOT = Path(__file__).resolve().parents[1]
if (_ROOT / "volta_ml" / "__init__.py").exists():
    sys.path.insert(0, str(_ROOT))
