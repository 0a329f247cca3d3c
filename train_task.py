#!/usr/bin/env python3
"""VOLTA/IGLUE-compatible `train_task.py`: same flags, files and log lines (see docs/training.md)."""
import sys

from volta_ml.cli.train_task import main

if __name__ == "__main__":
    sys.exit(main())
