"""Run eval_task.py / eval_retrieval.py with one injected fault (failure drills, tests/test_failure_drills_eval.py).

    python tests/helpers_drill_entry.py <fault> <script.py> [flags...]

fault: `forward` (the model raises on its 2nd forward), `getitem` (the dataset raises on its 3rd item, in a
worker when there are workers), `kill_worker` (the 3rd item SIGKILLs the worker loading it), `none`.
`DRILL_RANK` (env) limits the fault to that rank. Nothing in volta-ml is changed: the script's `main` runs
as is, with the model / dataset builders wrapped here.
"""
from __future__ import annotations

import os
import runpy
import signal
import sys
import time


def _fault_here() -> bool:
    wanted = os.environ.get("DRILL_RANK")
    return wanted is None or wanted == os.environ.get("RANK", "0")


def _say(kind: str) -> None:
    print(f"toy fault {kind} at {time.time():.3f}", file=sys.stderr, flush=True)


def _wrap_model(build_model):
    def build(*args, **kwargs):
        model = build_model(*args, **kwargs)
        forward, calls = model.forward, [0]

        def failing_forward(*a, **k):
            calls[0] += 1
            if calls[0] == 2:
                _say("forward")
                raise RuntimeError("toy fault: the model's forward failed")
            return forward(*a, **k)

        model.forward = failing_forward
        return model
    return build


def _wrap_dataset(build_dataset, kind: str):
    def build(*args, **kwargs):
        dataset = build_dataset(*args, **kwargs)
        base, seen = type(dataset), [0]

        def getitem(self, index):
            seen[0] += 1
            if seen[0] == 3:
                _say(kind)
                import torch.utils.data
                if kind == "kill_worker" and torch.utils.data.get_worker_info() is not None:
                    os.kill(os.getpid(), signal.SIGKILL)
                raise IndexError(f"toy fault: item {index} cannot be loaded")
            return base.__getitem__(self, index)

        dataset.__class__ = type(f"Faulty{base.__name__}", (base,), {"__getitem__": getitem})
        return dataset
    return build


def main() -> None:
    fault, script, *argv = sys.argv[1:]
    if fault != "none" and _fault_here():
        import volta_ml.models
        import volta_ml.tasks
        if fault == "forward":  # the factory's global, which from_pretrained (the run setup's loader) calls
            import volta_ml.models.factory as factory
            factory.build_model = volta_ml.models.build_model = _wrap_model(factory.build_model)
        else:
            family_for = volta_ml.tasks.family_for

            def faulty_family(entry):
                family = family_for(entry)

                class Family:
                    def __getattr__(self, name):
                        return getattr(family, name)
                    build_dataset = staticmethod(_wrap_dataset(family.build_dataset, fault))
                return Family()
            volta_ml.tasks.family_for = faulty_family
    sys.argv = [script, *argv]
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main()
