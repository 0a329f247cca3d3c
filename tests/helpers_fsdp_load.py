"""Two ways of building and sharding the same `volta-ml train --hf_model ... --sharding fsdp` model, in one multi-process
launch (tests/test_fsdp_load.py), and the two ways of exporting it:

    python -m torch.distributed.run --nproc_per_node 2 tests/helpers_fsdp_load.py OUT TRAIN_FLAGS...

For each fine-tuning (`--finetune lora --train_projector`, then `--finetune full`), each process builds the job
twice, from the same seed: as every rank did before (`today`: each process reads the weights, given a rank-0
`DistInfo` so the job builder loads them) and as the job builder now does (`meta`: the ranks but 0 build the model
on the meta device and receive rank 0's tensors unit by unit in `FullySharded.place`). Written to
`OUT/<finetune>_<way>_rank<r>.pt`: each parameter's local shard, each buffer, torch's random state after placing, whether
the process built its model on the meta device.
The full model is then exported both ways: `OUT/today_export` (the whole state gathered on rank 0, then
`save_pretrained`) and `OUT/units_export` (`hf.export.save_by_unit`, one FSDP unit at a time).
"""
from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def main(out: str, flags: list[str]) -> int:
    sys.path.insert(0, str(REPO))
    import torch
    import torch.distributed as dist
    from torch.distributed.tensor import DTensor
    from volta_ml.cli.train_flags import parse_train_args
    from volta_ml.cli.train_task import build_task_job, seed_everything, setup_logging
    from volta_ml.engine import sharding
    from volta_ml.engine.distributed import barrier, finish_process, init_distributed, shutdown
    from volta_ml.hf.export import save_by_unit
    info = init_distributed()
    setup_logging(info)
    out_dir = Path(out)
    for finetune in (["--train_projector"], ["--finetune", "full"]):
        name = finetune[-1].removeprefix("--train_")
        for way in ("today", "meta"):
            save = out_dir / f"{name}_{way}" / (f"rank{info.rank}" if way == "today" else "all")
            args = parse_train_args([*flags, *finetune, "--output_dir", str(save / "save"),
                                     "--logdir", str(save / "logs")])
            seed_everything(args.seed)
            job = build_task_job(args, dataclasses.replace(info, rank=0) if way == "today" else info)
            built_on_meta = sharding.holds_meta(job.model)
            shard = sharding.for_run(args, job, info)
            model = shard.place(job.model)
            held = {f"param:{n}": (p.to_local() if isinstance(p, DTensor) else p).detach().clone()
                    for n, p in model.named_parameters()}
            held.update({f"buffer:{n}": b.detach().clone() for n, b in model.named_buffers()})
            held["rng"] = torch.get_rng_state()
            held["built_on_meta"] = torch.tensor(built_on_meta)
            torch.save(held, out_dir / f"{name}_{way}_rank{info.rank}.pt")
            if name == "full" and way == "meta":
                save_by_unit(model.hf, out_dir / "units_export" if info.is_main else None)
                state = sharding.gather_full_state(model.hf)
                if info.is_main:
                    model.hf.save_pretrained(out_dir / "today_export", state_dict=state)
            barrier(info)
            del model, job, shard
    dist.barrier()
    shutdown(info)
    return finish_process(0)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2:]))
