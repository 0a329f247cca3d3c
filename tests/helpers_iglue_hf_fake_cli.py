"""`volta-ml iglue-hf` with the same flags, but the contract fakes of helpers_fake_backends as backends (for sweep
tests without model weights): --backend clip -> FakeDual, anything else -> FakeGenerative."""
import argparse
import sys

from helpers_fake_backends import FakeDual, FakeGenerative
from volta_ml.iglue_hf.cli import add_flags
from volta_ml.iglue_hf.run import run_iglue_hf

parser = argparse.ArgumentParser()
add_flags(parser)
args = parser.parse_args()
run_iglue_hf(vars(args), backend=FakeDual() if args.backend == "clip" else FakeGenerative())
sys.exit(0)
