"""Fine-tuning across processes, as torchrun starts them (RANK, WORLD_SIZE, LOCAL_RANK in the
environment): PyTorch's process group (NCCL on GPUs, gloo on a CPU), this process's rank, and
the few collectives the training loop needs. One process, no torchrun: a world of one, and every
call here does nothing."""

from __future__ import annotations

import contextlib
import os
import sys
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class Ranks:
    rank: int = 0
    world: int = 1
    local: int = 0
    local_world: int = 1  # the ranks on this host, which share its memory and cores

    @property
    def main(self) -> bool:
        """Rank 0 writes the checkpoint, the reports and the progress bar."""
        return self.rank == 0


def ranks_from_env() -> Ranks:
    return Ranks(int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1)), int(os.environ.get("LOCAL_RANK", 0)),
                 int(os.environ.get("LOCAL_WORLD_SIZE", 1)))


def rank_device(device: torch.device, ranks: Ranks) -> torch.device:
    """Each rank's own GPU (its local rank), or the CPU."""
    return torch.device("cuda", ranks.local) if device.type == "cuda" and ranks.world > 1 else device


@contextlib.contextmanager
def process_group(ranks: Ranks, device: torch.device, sharded: bool = False):
    """The ranks' process group; with `sharded` (FSDP) a group of one too, since FSDP's mesh and
    torch.distributed.checkpoint need one even where a single process trains."""
    if ranks.world == 1 and not sharded:
        yield
        return
    backend = "nccl" if device.type == "cuda" else "gloo"
    if device.type == "cuda" and device.index is not None:  # a world of one may name no index
        torch.cuda.set_device(device)
    if ranks.world == 1:  # no torchrun: an in-memory store instead of its rendezvous
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
    else:
        dist.init_process_group(backend)
    try:
        yield
    finally:
        dist.destroy_process_group()


def mean_over_ranks(value: torch.Tensor, ranks: Ranks) -> torch.Tensor:
    """The mean of a scalar tensor over the ranks (gloo has no AVG: a sum over the world)."""
    if ranks.world > 1:
        dist.all_reduce(value, dist.ReduceOp.SUM)
        value /= ranks.world
    return value


def any_rank(flag: bool, ranks: Ranks, device: torch.device) -> bool:
    """Whether the flag is set on any rank: a stop signal one rank got stops all at the same step."""
    if ranks.world == 1:
        return flag
    value = torch.tensor([int(flag)], device=device)
    dist.all_reduce(value, dist.ReduceOp.MAX)
    return bool(value.item())


def barrier(ranks: Ranks) -> None:
    if ranks.world > 1:
        dist.barrier()


def launch(nproc: int, argv: list[str]) -> int:
    """Run `python -m pipeline.cli *argv` on `nproc` ranks of this machine through torchrun's own
    launcher (the elastic agent, a rendezvous on localhost): what `torchrun --standalone` does.
    -> the exit code: 0, or the first failed rank's."""
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    config = LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=nproc, run_id=f"gpt2-deploy-{os.getpid()}",
                          rdzv_backend="c10d", rdzv_endpoint="localhost:0", max_restarts=0, monitor_interval=0.1)
    try:
        elastic_launch(config, sys.executable)("-m", "pipeline.cli", *argv)
    except ChildFailedError as e:
        return next((f.exitcode for f in e.failures.values() if f.exitcode > 0), 1)
    except SignalException as e:  # the launcher was signalled too: the ranks have saved and stopped
        return 128 + int(e.sigval)
    return 0
