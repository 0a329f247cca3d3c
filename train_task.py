#!/usr/bin/env python3
"""VOLTA/IGLUE-compatible `train_task.py`: same flags, files and log lines (see docs/training.md)."""
import sys

from volta_ml.engine.train_cli import main

if __name__ == "__main__":
    sys.exit(main())
