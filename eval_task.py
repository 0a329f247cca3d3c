#!/usr/bin/env python3
"""VOLTA/IGLUE-compatible `eval_task.py`: same flags, files and log lines (see docs/tasks.md)."""
import sys

from volta_ml.cli.eval_task import main

if __name__ == "__main__":
    sys.exit(main())
