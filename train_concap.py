#!/usr/bin/env python3
"""VOLTA-compatible `train_concap.py`: pretraining on Conceptual Captions, same flags (see docs/training.md)."""
import sys

from volta_ml.pretrain.cli import main

if __name__ == "__main__":
    sys.exit(main())
