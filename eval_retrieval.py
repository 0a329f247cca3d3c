#!/usr/bin/env python3
"""VOLTA/IGLUE-compatible `eval_retrieval.py`: same flags, files and Final lines (see docs/retrieval.md)."""
import sys

from volta_ml.cli.eval_retrieval import main

if __name__ == "__main__":
    sys.exit(main())
