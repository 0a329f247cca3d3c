#!/usr/bin/env python3
"""VOLTA-compatible `train_concap_wiki.py`: Conceptual Captions with interleaved Wikipedia MLM steps, same flags."""
import sys

from volta_ml.pretrain.cli import main_wiki

if __name__ == "__main__":
    sys.exit(main_wiki())
