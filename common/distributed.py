"""torchrun → DDP, and nothing else (one way to go multi-GPU and multi-node).

A plain `python train.py` is a world of one with no process group, so every helper here works
unchanged in single-process runs and tests.
"""

from __future__ import annotations

import contextlib
import datetime
import os
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel


@dataclass(frozen=True)
class DistInfo:
    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    enabled: bool

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def is_enabled() -> bool:
    return dist.is_available() and dist.is_initialized()


def setup_distributed(device: str | None = None, timeout_minutes: int = 30) -> DistInfo:
    """Reads torchrun's RANK/WORLD_SIZE/LOCAL_RANK; nccl on GPUs (gloo where torch has no NCCL), gloo on CPU. `device` forces
    "cpu" (tests, CPU clusters) even where CUDA exists."""
    use_cuda = torch.cuda.is_available() and device != "cpu"
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        dev = torch.device(device) if device else torch.device("cuda" if use_cuda else "cpu")
        return DistInfo(0, 1, 0, dev, False)
    rank = int(os.environ["RANK"])
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if use_cuda:
        if local_rank >= torch.cuda.device_count():
            raise RuntimeError(f"LOCAL_RANK {local_rank} but only {torch.cuda.device_count()} GPUs are visible; "
                               "set torchrun --nproc_per_node to the GPU count")
        torch.cuda.set_device(local_rank)
        dev = torch.device("cuda", local_rank)
    else:
        dev = torch.device("cpu")
    if not is_enabled():
        backend = pick_backend(use_cuda)
        if use_cuda and backend == "gloo" and rank == 0:
            print("note: this torch has no NCCL (Windows builds never do): DDP runs on gloo, whose gradient "
                  "all-reduce is slower; on Linux, torch's CUDA wheels bring NCCL", flush=True)
        dist.init_process_group(
            backend=backend,
            timeout=datetime.timedelta(minutes=timeout_minutes),
            device_id=dev if backend == "nccl" else None,
        )
    # every trainer calls this after `prepare_run_dir`: no rank reads the run folder before rank 0 has
    # checked it, taken its lock and moved an old run aside (init_process_group waits for all ranks only
    # as a side effect of the backend's rendezvous)
    dist.barrier()
    return DistInfo(rank, world, local_rank, dev, True)


def pick_backend(use_cuda: bool) -> str:
    """nccl for GPUs where this torch has it, else gloo (CPU runs; Windows, whose torch has no NCCL)."""
    return "nccl" if use_cuda and dist.is_nccl_available() else "gloo"


def wrap_ddp(model: nn.Module, info: DistInfo, **kwargs: Any) -> nn.Module:
    if not info.enabled:
        return model
    if not any(p.requires_grad for p in model.parameters()):
        return model  # nothing to synchronise (e.g. a frozen network)
    ids = [info.local_rank] if info.device.type == "cuda" else None
    return DistributedDataParallel(model, device_ids=ids, **kwargs)


def unwrap(model: nn.Module) -> nn.Module:
    model = getattr(model, "module", model)
    return getattr(model, "_orig_mod", model)


def all_reduce_mean(value: torch.Tensor) -> torch.Tensor:
    if not is_enabled():
        return value
    value = value.detach().clone()
    dist.all_reduce(value, op=dist.ReduceOp.SUM)
    return value / dist.get_world_size()


def any_rank(flag: bool) -> bool:
    """True on every rank when `flag` is True on any one (a SIGTERM that reached one process must
    stop all of them at the same step, or the others hang in the next collective)."""
    if not is_enabled():
        return flag
    on_nccl = dist.get_backend() == "nccl"
    t = torch.tensor([1.0 if flag else 0.0], device="cuda" if on_nccl else "cpu")
    dist.all_reduce(t)
    return bool(t.item() > 0)


def gather_objects(obj: Any) -> list[Any]:
    if not is_enabled():
        return [obj]
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def rank() -> int:
    return dist.get_rank() if is_enabled() else 0


def launched_as_rank0() -> bool:
    """Before the process group exists (config, presets, the run folder): torchrun's RANK says which
    process is rank 0; a plain `python train.py` is."""
    return os.environ.get("RANK", "0") == "0"


def broadcast_object(obj: Any) -> Any:
    """Rank 0's `obj` on every rank: a decision that only rank 0 may take (e.g. which checkpoint to
    resume: the others could see the folder at another moment, or another folder)."""
    if not is_enabled():
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def barrier() -> None:
    if is_enabled():
        dist.barrier()


def cleanup() -> None:
    if is_enabled():
        dist.destroy_process_group()


def no_sync(module: torch.nn.Module, skip: bool) -> contextlib.AbstractContextManager:
    """DDP's `no_sync()` when `skip` (a micro-batch before the last of an accumulation group: its
    gradients are all-reduced with the last one's), else nothing. Outside DDP always nothing."""
    if skip and is_enabled() and hasattr(module, "no_sync"):
        return module.no_sync()
    return contextlib.nullcontext()
