"""How the processes of a run hold the trained model: `--sharding ddp` (the default) or `--sharding fsdp`.

- `ddp` (`Replicated`): every rank holds the whole model, its gradients and its optimizer state;
  DistributedDataParallel all-reduces the gradients (no all-reduce on the micro-batches that only accumulate).
  The resume file is `pytorch_ckpt_latest.tar` with everything in it (`engine/checkpointing.py`).
- `fsdp` (`FullySharded`): PyTorch's FSDP2 (`torch.distributed.fsdp.fully_shard`). Each rank holds 1/N of every
  parameter, gradient and optimizer state. The job names the units (`TrainJob.shard_units`: one per decoder layer
  and per vision block of a Hugging Face model); each unit's parameters are all-gathered just before it runs and
  freed after it (forward and backward), the rest (embeddings, heads, norms) form the root unit. Gradients are
  reduce-scattered after every micro-batch, so they stay sharded between the micro-batches of an accumulated step
  (ZeRO-3's trade: more communication, no unsharded gradient kept). `--amp bf16` becomes FSDP's mixed precision
  policy (parameters all-gathered and computed in bf16, gradients reduced in fp32, the sharded parameters that the
  optimizer updates kept in their own dtype); `--fsdp_offload` keeps the sharded parameters, their gradients and
  the optimizer state in CPU memory (the optimizer steps on the CPU). The resume state is written with
  `torch.distributed.checkpoint` (`save_sharded_state`): every rank writes its own shards into a new folder
  `pytorch_ckpt_latest.shards/<id>/`, then rank 0 atomically replaces `pytorch_ckpt_latest.tar`, a small file
  with the step, schedule, RNG states and the folder's name, and removes the older folders. A kill at any moment
  leaves the previous `pytorch_ckpt_latest.tar` and the folder it names intact. The folder is re-sharded on load,
  so a run may resume on another number of processes (a plain `--sharding ddp` run can also resume from it).

`for_run(args, job, info)` picks the strategy; the training loop (`engine/train.py`) asks it to place the model,
wrap it, run a micro-batch, gather its state for `pytorch_model_*.bin`, save and load the resume state, and
evaluate. `gather_full_state(module)` is what a job's `on_best_saved` export uses to write a whole model: under
FSDP every rank calls it (it is collective) and rank 0 gets the tensors.
"""
from __future__ import annotations

import contextlib
import logging
import os
import pickle
import shutil
import uuid
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from volta_ml.atomic import WriteError, disk_error
from volta_ml.engine import checkpointing as ckpt
from volta_ml.engine.distributed import DistInfo, barrier, broadcast_object, gather_objects
from volta_ml.engine.failures import UsageError

logger = logging.getLogger("volta_ml.train")

SHARDS_NAME = "pytorch_ckpt_latest.shards"    # beside pytorch_ckpt_latest.tar: one folder per saved state


def cast_trainable(module: nn.Module, dtype: torch.dtype | None) -> None:
    """Trainable floating parameters of `module` to `dtype` (the optimizer's master copy), in place."""
    if dtype is None:
        return
    with torch.no_grad():
        for param in module.parameters():
            if param.requires_grad and param.is_floating_point() and param.dtype != dtype:
                param.data = param.data.to(dtype)


def lift_scalars(model: nn.Module) -> list[str]:
    """FSDP shards along dimension 0, so a 0-d parameter (CLIP's `logit_scale`) becomes a 1-element 1-d one, in
    place (the same value; arithmetic broadcasts it alike). Marked, so that `gather_full_state` gives it back its
    own shape. Returns the names."""
    lifted = []
    for name, module in model.named_modules():
        for key, param in list(module.named_parameters(recurse=False)):
            if param.dim() == 0:
                setattr(module, key, nn.Parameter(param.detach().reshape(1), requires_grad=param.requires_grad))
                module._volta_scalars = getattr(module, "_volta_scalars", set()) | {key}
                lifted.append(f"{name}.{key}" if name else key)
    return lifted


def is_sharded(module: nn.Module) -> bool:
    """Whether `module` holds FSDP-sharded parameters (DTensors)."""
    from torch.distributed.tensor import DTensor
    return any(isinstance(p, DTensor) for p in module.parameters())


def gather_full_state(module: nn.Module) -> dict | None:
    """`module.state_dict()` with whole tensors on the CPU, on rank 0; None on the other ranks. For a module with
    sharded (FSDP) parameters it is collective: every rank must call it, in the same order."""
    if not is_sharded(module):
        if dist.is_initialized() and dist.get_rank() != 0:
            return None
        return {key: value.detach().cpu() for key, value in module.state_dict().items()}
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
    state = get_model_state_dict(module, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if dist.get_rank() != 0:
        return None
    for prefix, owner in module.named_modules():
        for key in getattr(owner, "_volta_scalars", ()):
            name = f"{prefix}.{key}" if prefix else key
            if name in state:
                state[name] = state[name].reshape(())
    return state


def holds_meta(module: nn.Module) -> bool:
    """Whether some parameter or buffer of `module` is on the meta device (a shape without storage)."""
    return any(t.is_meta for t in module.parameters()) or any(t.is_meta for t in module.buffers())


def _owned_tensors(module: nn.Module, skip: set) -> list[tuple[nn.Module, str, str, torch.Tensor]]:
    """(owner, "_parameters" | "_buffers", key, tensor) of every parameter and buffer (persistent or not) of
    `module`'s submodules but those whose id is in `skip`, in module order (the same order on every rank)."""
    return [(owner, kind, key, tensor) for owner in module.modules() if id(owner) not in skip
            for kind in ("_parameters", "_buffers") for key, tensor in getattr(owner, kind).items()
            if tensor is not None]


def _rows(tensor: torch.Tensor, world: int) -> list[tuple[int, int]]:
    """(first row, rows) of each rank's shard of `tensor` along dimension 0, as FSDP2 cuts it (`torch.chunk` into
    `world` pieces, the missing ones empty)."""
    if tensor.dim() == 0:
        return [(0, 0)] * world
    size = -(-tensor.shape[0] // world)
    return [(min(r * size, tensor.shape[0]), max(0, min(size, tensor.shape[0] - r * size))) for r in range(world)]


def take_from_rank0(module: nn.Module, skip: set, info: DistInfo) -> None:
    """Rank 0's parameters and buffers of `module` (but those of the submodules in `skip`) sent to the other ranks,
    which built theirs on the meta device. Called unit by unit just before the unit is sharded, so the weights are
    read from disk once (by rank 0). A parameter becomes, on a rank > 0, a tensor of its whole shape of which rank 0
    sends only the rows this rank's FSDP shard holds (dimension 0, FSDP2's cut): the other rows are never written,
    so their memory pages are never touched and the rank's resident memory grows by its shard alone (on the CPU;
    a GPU allocates the whole unit for a moment). Buffers (persistent or not: rotary `inv_freq`) are replicated:
    broadcast whole. A parameter keeps its `requires_grad`; a tensor held by two modules (tied weights) stays one
    tensor. Shapes and dtypes are rank 0's; a rank whose model differs in shape stops with a RuntimeError naming
    the tensor. Collective."""
    owned = _owned_tensors(module, skip)
    unique: dict[int, torch.Tensor] = {}
    for *_, tensor in owned:
        unique.setdefault(id(tensor), tensor)
    specs = broadcast_object([(tuple(t.shape), t.dtype) for t in unique.values()], info)
    if len(specs) != len(unique):
        raise RuntimeError(f"--sharding fsdp: rank {info.rank} builds {len(unique)} tensors in a unit where rank 0 "
                           f"has {len(specs)}")
    device = info.device if dist.get_backend() == "nccl" else torch.device("cpu")
    names = {id(t): f"{type(owner).__name__}.{key}" for owner, _, key, t in owned}
    received: dict[int, torch.Tensor] = {}
    for (key, tensor), (shape, dtype) in zip(unique.items(), specs):
        if tuple(tensor.shape) != shape:
            raise RuntimeError(f"--sharding fsdp: {names[key]} has shape {tuple(tensor.shape)} on rank {info.rank}, "
                               f"{shape} on rank 0")
        parameter = isinstance(tensor, nn.Parameter)
        rows = _rows(tensor, info.world_size)
        if info.is_main:
            sent = tensor.detach().to(device).contiguous()
            if not parameter or sent.dim() == 0:
                dist.broadcast(sent, src=0)
                continue
            pending = [dist.isend(sent.narrow(0, first, count), dst=rank)
                       for rank, (first, count) in enumerate(rows) if rank and count]
            for work in pending:
                work.wait()
            continue
        value = torch.empty(shape, dtype=dtype, device=device)
        if not parameter or value.dim() == 0:
            dist.broadcast(value, src=0)
        elif rows[info.rank][1]:
            dist.recv(value.narrow(0, *rows[info.rank]), src=0)
        received[key] = nn.Parameter(value, requires_grad=tensor.requires_grad) if parameter else value
    for owner, kind, key, tensor in owned if received else ():
        getattr(owner, kind)[key] = received[id(tensor)]


def sync_rng_from_rank0(info: DistInfo) -> None:
    """torch's CPU random state of rank 0 on every rank: building a model on the meta device draws no random
    numbers where rank 0's load does (a new LoRA's initialisation), so the ranks would leave the build in
    different states, where a run built as before leaves them all alike."""
    state = broadcast_object(torch.get_rng_state(), info)
    torch.set_rng_state(state)


class Replicated:
    """`--sharding ddp`: the whole model on every rank, DistributedDataParallel across ranks."""
    name = "ddp"
    lockstep = False          # evaluation: each rank runs its own share of the batches
    collective = False        # gathering the weights (model_state, gather_full_state): rank 0 alone

    def __init__(self, args, job, info: DistInfo):
        self.args, self.job, self.info = args, job, info

    def describe(self) -> str:
        return "ddp (every process holds the whole model)" if self.info.world_size > 1 else "one process"

    def place(self, model: nn.Module) -> nn.Module:
        cast_trainable(model, self.job.train_dtype)
        return model.to(self.info.device)

    def wrap(self, model: nn.Module) -> nn.Module:
        if self.info.world_size > 1:
            from torch.nn.parallel import DistributedDataParallel
            model = DistributedDataParallel(model, device_ids=[self.info.device.index]
                                            if self.info.device.type == "cuda" else None,
                                            find_unused_parameters=True)
        if self.args.compile:   # after DDP, so its bucketed all-reduce stays outside the compiled graphs
            model = torch.compile(model)
        return model

    def micro_batch(self, model: nn.Module, is_step: bool):
        """No gradient all-reduce on a micro-batch that only accumulates."""
        return model.no_sync() if self.info.world_size > 1 and not is_step else contextlib.nullcontext()

    def model_state(self, model: nn.Module) -> dict | None:
        """What `pytorch_model_<N>.bin` holds (the bare model's state_dict), on rank 0; None elsewhere."""
        if not self.info.is_main:
            return None
        return {key: value.detach().cpu() for key, value in ckpt.unwrap(model).state_dict().items()}

    def save_latest(self, path: Path, model, optimizer, pending: bool, **fields) -> None:
        rng = gather_objects(ckpt.capture_rng_state(), self.info)
        grads = ({n: p.grad for n, p in ckpt.unwrap(model).named_parameters() if p.grad is not None}
                 if pending else None)
        if self.info.is_main:
            ckpt.save_latest(path, model=model, optimizer=optimizer, rng_states=rng, pending_grads=grads, **fields)
        barrier(self.info)

    def load_latest(self, path, state: dict, model, optimizer) -> None:
        """Model, optimizer and pending gradients of a resume file (the loop restores the rest)."""
        if "sharded" in state:
            load_sharded_state(path, state, model, optimizer)
            return
        model.load_state_dict(state["model_state_dict"])
        if state["format"] != "volta":
            optimizer.load_state_dict(state["optimizer_state_dict"])
            params = dict(model.named_parameters())
            for name, grad in state.get("pending_grads", {}).items():
                params[name].grad = grad.to(params[name].device)

    def evaluating(self, model: nn.Module):
        return contextlib.nullcontext()

    def close(self) -> None:
        pass


class FullySharded(Replicated):
    """`--sharding fsdp`: FSDP2 over all the processes of the run (one mesh dimension)."""
    name = "fsdp"
    lockstep = True           # evaluation: every rank runs as many forwards as the others (collectives inside)
    collective = True         # gathering the weights: every rank takes part

    def __init__(self, args, job, info: DistInfo):
        super().__init__(args, job, info)
        if job.shard_units is None:
            raise UsageError("--sharding fsdp: this job's model cannot be sharded (Hugging Face models only: "
                             "--hf_model)")
        if job.interleaved is not None:
            raise UsageError("--sharding fsdp: not with an interleaved second data set")
        self.own_group = False
        if not dist.is_initialized():   # one process: FSDP2 still needs a process group (of one)
            backend = "nccl" if info.device.type == "cuda" else "gloo"
            dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
            self.own_group = True

    def describe(self) -> str:
        policy = []
        if self.args.amp == "bf16":
            policy.append("bf16 parameters, fp32 gradient reduction")
        if self.args.fsdp_offload:
            policy.append("parameters, gradients and optimizer state offloaded to CPU memory")
        return (f"fsdp over {self.info.world_size} process(es), each holding 1/{self.info.world_size} of the "
                f"parameters, gradients and optimizer state" + (f"; {', '.join(policy)}" if policy else ""))

    def _policies(self) -> dict:
        from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy
        kwargs = {}
        if self.args.amp == "bf16":
            kwargs["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        if self.args.fsdp_offload:
            kwargs["offload_policy"] = CPUOffloadPolicy(pin_memory=self.info.device.type == "cuda")
        return kwargs

    def place(self, model: nn.Module) -> nn.Module:
        """`fully_shard` on each unit, then on the model (the root unit). Each unit's trainable tensors are cast to
        the job's `train_dtype` just before it is sharded, so no rank ever holds a whole model in that dtype."""
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard
        mesh = init_device_mesh(self.info.device.type, (self.info.world_size,))
        kwargs = self._policies()
        lift_scalars(model)
        units = self.job.shard_units(model)
        if not units:
            raise UsageError("--sharding fsdp: the model has no blocks to shard (no decoder layers or vision blocks "
                             "found)")
        receive = any(gather_objects(holds_meta(model), self.info))
        if receive and holds_meta(model) and self.info.is_main:
            raise RuntimeError("--sharding fsdp: rank 0 holds no weights (a model built on the meta device)")
        for unit in units:
            if receive:
                take_from_rank0(unit, (), self.info)
            cast_trainable(unit, self.job.train_dtype)
            fully_shard(unit, mesh=mesh, **kwargs)
        if receive:    # the root: what no unit holds
            take_from_rank0(model, {id(m) for unit in units for m in unit.modules()}, self.info)
            sync_rng_from_rank0(self.info)
        cast_trainable(model, self.job.train_dtype)
        fully_shard(model, mesh=mesh, **kwargs)
        self.units = len(units)
        return model

    def wrap(self, model: nn.Module) -> nn.Module:
        return model

    def micro_batch(self, model: nn.Module, is_step: bool):
        return contextlib.nullcontext()    # every micro-batch reduce-scatters: the gradients stay sharded

    def model_state(self, model: nn.Module) -> dict | None:
        return gather_full_state(model)

    def save_latest(self, path: Path, model, optimizer, pending: bool, **fields) -> None:
        save_sharded_state(path, model, optimizer, pending, self.info, **fields)

    def load_latest(self, path, state: dict, model, optimizer) -> None:
        if "sharded" not in state:
            raise UsageError(f"--resume_file {path}: written by a --sharding ddp run (or by VOLTA); resume it with "
                             f"--sharding ddp")
        load_sharded_state(path, state, model, optimizer)

    def evaluating(self, model: nn.Module):
        """The root unit's parameters stay gathered during evaluation: a job's scoring may call the inner model
        directly (the iglue-hf rules, `generate`), past the root's forward that would gather them."""
        @contextlib.contextmanager
        def gathered():
            model.unshard()
            try:
                yield
            finally:
                model.reshard()
        return gathered()

    def close(self) -> None:
        if self.own_group and dist.is_initialized():
            dist.destroy_process_group()


SHARDINGS = {"ddp": Replicated, "fsdp": FullySharded}


def check_flags(args) -> str:
    """The `--sharding` name, after the checks the flags alone allow (one-line `UsageError`s); the command line runs
    them before it builds anything."""
    name = getattr(args, "sharding", "ddp") or "ddp"
    if name not in SHARDINGS:
        raise UsageError(f"--sharding {name}: unknown; known: {', '.join(SHARDINGS)}")
    if getattr(args, "fsdp_offload", False) and name != "fsdp":
        raise UsageError("--fsdp_offload: only with --sharding fsdp")
    if name == "fsdp" and args.amp == "fp16":
        raise UsageError("--sharding fsdp: --amp fp16 is not supported (its loss scaling); use --amp bf16")
    if name == "fsdp" and args.compile:
        raise UsageError("--sharding fsdp: --compile is not supported with sharding")
    return name


def for_run(args, job, info: DistInfo) -> Replicated:
    """The strategy named by `--sharding` (one-line `UsageError` for a combination that cannot work)."""
    return SHARDINGS[check_flags(args)](args, job, info)


# ---- the sharded resume state ---------------------------------------------------------------------------------

def _trainable(model: nn.Module) -> dict[str, torch.Tensor]:
    return {name: param for name, param in ckpt.unwrap(model).named_parameters() if param.requires_grad}


def shard_folder(path, state: dict) -> Path:
    return Path(path).parent / SHARDS_NAME / state["sharded"]["folder"]


def _optimizer_layout(optimizer, params: dict[str, torch.Tensor]) -> tuple[dict, dict, list]:
    """(tensors, layout, groups) of the optimizer's state: its tensors by "<name>/<key>" for the checkpoint
    folder; per parameter name and key either ["param", dtype] (shaped and sharded like the parameter),
    ["tensor", shape, dtype] (a small replicated tensor) or ["value", v] (a plain value); and the parameter groups
    without their tensors (learning rates and hyperparameters, as Optimizer.state_dict keeps them)."""
    from torch.distributed.tensor import DTensor
    tensors, layout = {}, {}
    for name, param in params.items():
        state = optimizer.state.get(param)
        if not state:
            continue
        layout[name] = {}
        for key, value in state.items():
            if isinstance(value, torch.Tensor) and (isinstance(value, DTensor) or value.shape == param.shape
                                                    and value.dim() > 0):
                layout[name][key] = ["param", str(value.dtype).removeprefix("torch.")]
                tensors[f"{name}/{key}"] = value
            elif isinstance(value, torch.Tensor):
                layout[name][key] = ["tensor", list(value.shape), str(value.dtype).removeprefix("torch.")]
                tensors[f"{name}/{key}"] = value
            else:
                layout[name][key] = ["value", value]
    groups = [{k: v for k, v in group.items() if k != "params"} for group in optimizer.param_groups]
    return tensors, layout, groups


def save_sharded_state(path: Path, model, optimizer, pending: bool, info: DistInfo, **fields) -> None:
    """The resume state of an FSDP run: shards with torch.distributed.checkpoint into a new folder, then
    `path` (pytorch_ckpt_latest.tar) atomically replaced by rank 0 to name it (module docstring). Collective."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException
    rng = gather_objects(ckpt.capture_rng_state(), info)
    name = broadcast_object(uuid.uuid4().hex[:12], info)
    folder = Path(path).parent / SHARDS_NAME / name
    params = _trainable(model)
    grads = {n: p.grad for n, p in params.items() if p.grad is not None} if pending else {}
    optim_tensors, layout, groups = _optimizer_layout(optimizer, params)
    try:
        dcp.save({"model": params, "optimizer": optim_tensors, "grads": grads}, checkpoint_id=str(folder))
    except (Exception, CheckpointException) as error:   # any rank's failure reaches every rank
        if info.is_main:
            shutil.rmtree(folder, ignore_errors=True)
        disk = disk_error(error)
        if disk is not None:
            raise WriteError(Path(path), disk) from error
        if isinstance(error, CheckpointException):   # a BaseException: make it an error the CLI reports
            raise RuntimeError(f"writing {folder} failed: {error}") from error
        raise
    if info.is_main:
        sharded = {"folder": name, "processes": info.world_size, "pending": sorted(grads),
                   "optimizer": layout, "param_groups": groups,
                   "shapes": {k: list(v.shape) for k, v in ckpt.unwrap(model).state_dict().items()}}
        ckpt.save_latest(path, model=None, optimizer=None, rng_states=rng, pending_grads=None, sharded=sharded,
                         **fields)
        remove_stale_shards(Path(path).parent, keep=name)
    barrier(info)


def load_sharded_state(path, state: dict, model, optimizer) -> None:
    """Model, optimizer and pending gradients from the folder `state` names, re-sharded onto this run's
    processes (any number of them, FSDP or not). The folder is checked first (`check_shard_folder`: a damaged
    or unreadable one is said so, another model's tensors are named), then loaded with torch.distributed.checkpoint,
    whose own log records (tracebacks through the root logger) are held back (`_quiet_dcp`)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException
    sharded = state["sharded"]
    folder = shard_folder(path, state)
    if not (folder / ".metadata").is_file():
        raise UsageError(f"--resume_file {path}: its sharded state {folder} is missing or incomplete")
    params = _trainable(model)
    # a 0-d parameter was saved 1-d (`lift_scalars`): loaded through a 1-d view where this run keeps it 0-d
    targets = {name: p.view(1) if p.dim() == 0 else p for name, p in params.items()}
    missing = sorted(set(sharded["optimizer"]) - set(params)) + sorted(set(sharded["pending"]) - set(params))
    if missing:
        raise UsageError(f"--resume_file {path}: its sharded state holds tensors this model does not train "
                         f"({', '.join(missing[:3])})")
    pending = {name: torch.zeros_like(targets[name]) for name in sharded["pending"]}
    optim_tensors, optim_state = {}, {}
    for name, keys in sharded["optimizer"].items():
        optim_state[name] = {}
        for key, (kind, *spec) in keys.items():
            if kind == "value":
                optim_state[name][key] = spec[0]
                continue
            dtype = getattr(torch, spec[-1])
            if kind == "param":
                tensor = torch.zeros_like(targets[name], dtype=dtype)
            else:
                tensor = torch.zeros(spec[0], dtype=dtype, device=params[name].device)
            optim_state[name][key] = optim_tensors[f"{name}/{key}"] = tensor
    wanted = {"model": targets, "optimizer": optim_tensors, "grads": pending}
    verdicts = _every_rank(check_shard_folder(folder, wanted))
    fault = next((v for v in verdicts if v is not None), None)
    if fault is not None:
        raise UsageError(f"--resume_file {path}: {fault}")
    try:
        with _quiet_dcp():
            dcp.load(wanted, checkpoint_id=str(folder))
    except (Exception, CheckpointException) as error:   # the files passed the checks: read errors of their data
        raise UsageError(f"--resume_file {path}: its sharded state {folder} is damaged or unreadable "
                         f"({_dcp_cause(error)})") from None
    if len(sharded["param_groups"]) != len(optimizer.param_groups):
        raise UsageError(f"--resume_file {path}: {len(sharded['param_groups'])} optimizer parameter groups saved, "
                         f"this run has {len(optimizer.param_groups)}")
    for group, saved in zip(optimizer.param_groups, sharded["param_groups"]):
        group.update(saved)
    optimizer.state.clear()
    for name, values in optim_state.items():
        optimizer.state[params[name]] = {key: value.view(params[name].shape) if isinstance(value, torch.Tensor)
                                         and value.shape != params[name].shape and value.numel() == 1
                                         and params[name].dim() == 0 else value for key, value in values.items()}
    for name, grad in pending.items():
        params[name].grad = grad.view(params[name].shape)


def _every_rank(verdict: str | None) -> list:
    """Every rank's verdict on the folder (they read the same files, but a rank that alone refused would leave
    the others waiting in the load's collectives)."""
    if not (dist.is_initialized() and dist.get_world_size() > 1):
        return [verdict]
    return gather_objects(verdict, DistInfo(rank=dist.get_rank(), world_size=dist.get_world_size(),
                                            initialized=True))


def check_shard_folder(folder: Path, wanted: dict[str, dict[str, torch.Tensor]]) -> str | None:
    """What is wrong with the sharded state `folder` for loading `wanted` ({"model" | "optimizer" | "grads":
    {name: tensor}}), in words, or None. Damaged or unreadable: a `.metadata` that does not unpickle into
    torch.distributed.checkpoint's Metadata (read with its own FileSystemReader), or a data file missing or shorter
    than the metadata says. Another model: the metadata's tensors are not this model's trainable tensors (names and
    whole shapes). Checked before `dcp.load`, which would log its tracebacks and name neither cause."""
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import Metadata, TensorStorageMetadata
    try:
        with _quiet_dcp():
            metadata = FileSystemReader(str(folder)).read_metadata()
        if not isinstance(metadata, Metadata) or not isinstance(metadata.state_dict_metadata, dict):
            raise ValueError(f"it holds a {type(metadata).__name__}, not torch.distributed.checkpoint's Metadata")
        ends: dict[str, int] = {}
        for where in (metadata.storage_data or {}).values():
            ends[where.relative_path] = max(ends.get(where.relative_path, 0), int(where.offset) + int(where.length))
    except Exception as error:  # noqa: BLE001 - anything unpickling garbage raises means: damaged
        return (f"its sharded state {folder} is damaged or unreadable (.metadata: {type(error).__name__}: "
                f"{_first_line(error)})")
    for name, end in sorted(ends.items()):
        data = folder / name
        size = data.stat().st_size if data.is_file() else None
        if size is None or size < end:
            found = "missing" if size is None else f"{size} bytes, the metadata places data up to byte {end}"
            return f"its sharded state {folder} is damaged or unreadable ({name}: {found}; cut short?)"
    saved = {key: list(meta.size) for key, meta in metadata.state_dict_metadata.items()
             if isinstance(meta, TensorStorageMetadata)}
    expected = {f"{part}.{name}": list(tensor.shape) for part, tensors in wanted.items()
                for name, tensor in tensors.items()}
    # the model's tensors all, and of the optimizer's and pending gradients those the resume file lists
    saved = {key: shape for key, shape in saved.items() if key in expected or key.startswith("model.")}
    differences = ckpt.shape_differences(saved, expected)
    if not differences:
        return None
    return f"its sharded state {folder} holds another model's tensors: {differences}"


def _first_line(error: BaseException) -> str:
    return (str(error).strip().splitlines() or [""])[0][:300]


def _dcp_cause(error: BaseException) -> str:
    """The first rank's own error inside torch.distributed.checkpoint's CheckpointException (which says only
    which ranks failed), else the error itself."""
    failures = getattr(error, "failures", None)
    if isinstance(failures, dict) and failures:
        rank, cause = min(failures.items())
        cause = cause[0] if isinstance(cause, tuple) else cause
        return f"rank {rank}: {_named(cause)}"
    return _named(error)


def _named(error: BaseException) -> str:
    if isinstance(error, pickle.UnpicklingError):   # torch's weights-only refusal suggests unsafe loading: not that
        return "UnpicklingError: a tensor record that does not unpickle"
    return f"{type(error).__name__}: {_first_line(error)}".rstrip(": ")


class _FromDcp(logging.Filter):
    """Drops the records torch.distributed.checkpoint's modules log through the root logger (its load logs a
    metadata it cannot read as two warnings with tracebacks)."""
    def __init__(self):
        super().__init__()
        import torch.distributed.checkpoint as dcp
        self.package = os.path.dirname(dcp.__file__)

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.pathname.startswith(self.package)


@contextlib.contextmanager
def _quiet_dcp():
    """torch.distributed.checkpoint's log records held back: those of the root logger (filtered) and of its own
    loggers (their level raised): a failed load is reported in one line by the caller instead."""
    root, own = logging.getLogger(), logging.getLogger("torch.distributed.checkpoint")
    quiet, level = _FromDcp(), own.level
    root.addFilter(quiet)
    own.setLevel(logging.CRITICAL + 1)
    try:
        yield
    finally:
        root.removeFilter(quiet)
        own.setLevel(level)


def remove_stale_shards(run_dir: Path, keep: str | None = None) -> None:
    """Folders of `pytorch_ckpt_latest.shards/` other than `keep` (or than the one pytorch_ckpt_latest.tar names):
    older states, and writes a kill interrupted."""
    root = Path(run_dir) / SHARDS_NAME
    if not root.is_dir():
        return
    if keep is None:
        latest = Path(run_dir) / ckpt.LATEST_NAME
        try:
            keep = (ckpt.load_latest(latest).get("sharded") or {}).get("folder") if latest.exists() else None
        except UsageError:
            keep = None
    for folder in root.iterdir():
        if folder.name != keep:
            shutil.rmtree(folder, ignore_errors=True)
    with contextlib.suppress(OSError):
        fd = os.open(root, os.O_RDONLY)
        os.fsync(fd)
        os.close(fd)
