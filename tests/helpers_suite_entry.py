"""`volta-ml suite` with its own flags but the contract fakes as backends: the sweep test's command, and the
torchrun entry of the 2-process test (`--backend clip` -> FakeDual, anything else -> FakeExamGenerative)."""
import argparse
import sys

from helpers_fake_backends import FakeDual
from helpers_suite import EXAM_ANSWERS, FakeExamGenerative
from volta_ml.engine.distributed import finish_process
from volta_ml.suite.cli import add_flags
from volta_ml.suite.run import run_suite

parser = argparse.ArgumentParser()
add_flags(parser)
args = parser.parse_args()
run_suite(vars(args), backend=FakeDual() if args.backend == "clip" else FakeExamGenerative(answers=EXAM_ANSWERS))
sys.exit(finish_process(0))
