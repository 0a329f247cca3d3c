#!/usr/bin/env python3
"""IGLUE-compatible `scripts/GQA_score.py`: prints the xGQA accuracy (%) as the last stdout line."""
import sys

from volta_ml.cli.gqa_score import main

if __name__ == "__main__":
    sys.exit(main())
