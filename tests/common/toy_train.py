"""A tiny but complete training loop over common/ (used by the resume and DDP tests, run as a
fresh process each time, exactly as a user's run would be)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import Dataset

from common import distributed
from common.checkpoint import CheckpointManager, load_checkpoint, make_state, resolve_resume, restore_state
from common.data import ResumableSampler, make_loader, sample_rng
from common.guards import NonFiniteGuard
from common.muon import MuonAdamW
from common.schedulers import build_scheduler
from common.training import EMA, step_optimizer


class NoisyRegression(Dataset):
    """Random crops + noise drawn from the sample key, like the trainers' datasets."""

    def __init__(self, n: int = 40) -> None:
        g = torch.Generator().manual_seed(123)
        self.x = torch.randn(n, 24, generator=g)
        self.y = self.x[:, :8].sum(1, keepdim=True)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, key):
        index, rng = sample_rng(key)
        start = int(rng.integers(0, 8))
        noise = torch.from_numpy(rng.standard_normal(16).astype("float32")) * 0.01
        return self.x[index, start : start + 16] + noise, self.y[index]


def build_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Dropout(0.1), nn.Linear(32, 32), nn.GELU(), nn.Linear(32, 1))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--run_dir", required=True)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--stop_after", type=int, default=None, help="save and exit after this many steps")
    ap.add_argument("--save_at", type=int, default=None, help="save after this many steps and go on (a copy of the "
                    "run folder then resumes from there: one process fewer than a stop and a resume)")
    ap.add_argument("--resume", default=None)
    ap.add_argument("--workers", type=int, default=2)
    args = ap.parse_args()

    info = distributed.setup_distributed(device="cpu")
    model = build_model()
    ddp_model = distributed.wrap_ddp(model, info)
    optimizer = MuonAdamW(model, lr=3e-3, betas=(0.8, 0.99))
    scheduler = build_scheduler(optimizer, "cosine_with_warmup", warmup_steps=3, total_steps=args.steps)
    ema = EMA(model, decay=0.9)
    guard = NonFiniteGuard()
    data = NoisyRegression()
    sampler = ResumableSampler(data, shuffle=True, seed=7)
    loader = make_loader(data, batch_size=4, sampler=sampler, num_workers=args.workers, persistent_workers=False)
    manager = CheckpointManager(Path(args.run_dir) / "ckpt", keep_last=2)

    step, epoch, batch_in_epoch = 0, 0, 0
    ckpt_path = resolve_resume(args.resume, manager.dir, manager)
    if ckpt_path is not None:
        counters = restore_state(load_checkpoint(ckpt_path), {"model": model}, {"opt": optimizer},
                                 {"sched": scheduler}, ema={"ema": ema}, rank=info.rank)
        step, epoch, batch_in_epoch = counters["step"], counters["epoch"], counters["batch_in_epoch"]

    losses = []
    while step < args.steps:
        sampler.set_epoch(epoch)
        sampler.skip_samples(batch_in_epoch * 4)
        for x, y in loader:
            loss = nn.functional.mse_loss(ddp_model(x), y)
            step_optimizer(loss, optimizer, model.parameters(), guard=guard, clip_grad_norm=1.0)
            scheduler.step()
            ema.update(model)
            losses.append(distributed.all_reduce_mean(loss.detach()).item())
            step += 1
            batch_in_epoch += 1
            if step == args.save_at:
                save(manager, info, model, optimizer, scheduler, ema, step, epoch, batch_in_epoch)
            if step == args.stop_after or step >= args.steps:
                break
        else:
            epoch, batch_in_epoch = epoch + 1, 0
            continue
        if step == args.stop_after:
            save(manager, info, model, optimizer, scheduler, ema, step, epoch, batch_in_epoch)
            distributed.barrier()  # leave together: a rank tearing gloo down while the other still writes aborts
            distributed.cleanup()
            return

    params = distributed.gather_objects([p.detach().clone() for p in model.parameters()])
    if info.is_main:
        out = Path(args.run_dir)
        out.mkdir(parents=True, exist_ok=True)
        torch.save({"params": params[0], "all_ranks": params, "ema": ema.shadow}, out / "final.pt")
        (out / "losses.json").write_text(json.dumps(losses))
    distributed.barrier()  # as above: rank 1 must not destroy the process group while rank 0 still writes
    distributed.cleanup()


def save(manager: CheckpointManager, info, model, optimizer, scheduler, ema, step: int, epoch: int,
         batch_in_epoch: int) -> None:
    state = make_state({"model": model}, {"opt": optimizer}, {"sched": scheduler}, ema={"ema": ema},
                       counters={"step": step, "epoch": epoch, "batch_in_epoch": batch_in_epoch})
    if info.is_main:
        manager.save(state, step)


if __name__ == "__main__":
    main()
