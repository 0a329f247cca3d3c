"""torchrun entry for the 2-process test: run_iglue_hf with the fake backend the options' task needs."""
import json
import sys

from helpers_fake_backends import FakeDual, FakeGenerative
from volta_ml.engine.distributed import finish_process
from volta_ml.iglue_hf.run import run_iglue_hf

options = json.loads(open(sys.argv[1]).read())
backend = FakeDual() if options["task"] in ("xflickrco", "wit") else FakeGenerative()
run_iglue_hf(options, backend=backend)
sys.exit(finish_process(0))
