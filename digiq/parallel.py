"""Data parallelism over processes through ``accelerate``: several GPUs, or two CPU processes in the tests.

A stage started by ``accelerate launch --num_processes N -m digiq.stages.launch MODULE``
(what :func:`digiq.stages.launch.run_stage` does when ``compute.processes > 1``) runs
the same code in N processes. Each process takes every N-th row of a global
batch (:func:`shard`), and after ``backward`` the processes average their
gradients (:func:`average_gradients`), so every optimizer step sees the
gradient of the whole batch and the replicas stay identical. Only the main
process writes files (:func:`is_main`).

Our losses come from model methods (``AutoUIPolicy.loss``, ``ScreenVLM.loss``,
``td_losses``), not from one ``forward``, so the loops average gradients
themselves (one all-reduce of all gradients, flattened) instead of wrapping
models in DDP. With one process every function here is a no-op, and a run is
exactly the plain single-process loop.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import TypeVar

import torch
from accelerate import PartialState
from accelerate.utils import parse_flag_from_env

__all__ = [
    "state",
    "device",
    "is_main",
    "barrier",
    "broadcast",
    "shard",
    "average_gradients",
    "global_mean",
    "backward_share",
    "shard_model",
    "full_weights",
]

T = TypeVar("T")


def state() -> PartialState:
    """The process group of this run (created on first use; one process unless launched by accelerate).

    Processes use the CPU (gloo) where there is no GPU or ``ACCELERATE_USE_CPU``
    is set (:func:`digiq.stages.launch.run_stage` sets it for ``compute.cpu``).
    """
    return PartialState(cpu=parse_flag_from_env("ACCELERATE_USE_CPU") or not torch.cuda.is_available())


def device() -> torch.device:
    """This process's device: its own GPU when there are GPUs, else the CPU."""
    return state().device


def is_main() -> bool:
    return state().is_main_process


def barrier() -> None:
    """Wait until every process gets here (after the main process wrote what the others read).

    CPU processes on a machine with GPUs (``compute.cpu``) use the plain gloo
    barrier: accelerate's ``wait_for_everyone`` names the process's GPU
    (``device_ids=[local rank]``) whatever the backend, and on a one-GPU
    machine the second process failed with "invalid device ordinal".
    """
    s = state()
    if s.device.type == "cpu" and s.num_processes > 1:
        torch.distributed.barrier()
    else:
        s.wait_for_everyone()


def broadcast(value: T) -> T:
    """The main process's ``value``, in every process (with one process, ``value`` itself)."""
    s = state()
    if s.num_processes == 1:
        return value
    box = [value]
    torch.distributed.broadcast_object_list(box, src=0)
    return box[0]


def shard(rows: Sequence[T], weights: Sequence[float] | None = None) -> tuple[list[T], float]:
    """This process's rows of a global batch, and the factor for its mean loss.

    Each process minimises its own rows' (weighted) mean loss times the
    factor: its share of the batch's total weight, times the number of
    processes. Averaged over processes, the gradients are then exactly the
    gradient of the whole batch's mean loss, however unevenly it splits.
    Weights count by their size, |w|, as ``AutoUIPolicy.loss`` normalises a
    weighted loss by sum(|w|) (weights of either sign, REINFORCE's).
    """
    s = state()
    if s.num_processes == 1:
        return list(rows), 1.0
    idx = range(s.process_index, len(rows), s.num_processes)
    w = [1.0] * len(rows) if weights is None else [abs(float(x)) for x in weights]
    total = sum(w)
    return [rows[i] for i in idx], (sum(w[i] for i in idx) * s.num_processes / total if total else 0.0)


def average_gradients(params: Iterable[torch.nn.Parameter]) -> None:
    """Replace every process's gradients by their mean over processes (missing gradients count as zero)."""
    s = state()
    if s.num_processes == 1:
        return
    params = [p for p in params if p.requires_grad]
    flat = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).flatten() for p in params])
    torch.distributed.all_reduce(flat)
    flat /= s.num_processes
    start = 0
    for p in params:
        n = p.numel()
        p.grad = flat[start : start + n].view_as(p).clone()
        start += n


def global_mean(value: float) -> float:
    """The mean of a number over processes (a loss for the curves); the number itself with one process."""
    s = state()
    if s.num_processes == 1:
        return value
    t = torch.tensor([value], dtype=torch.float64, device=s.device)
    torch.distributed.all_reduce(t)
    return float(t) / s.num_processes


def backward_share(rows: Sequence[T], losses: Callable[[list[T]], dict[str, torch.Tensor]],
                   params: Iterable[torch.nn.Parameter], names: Sequence[str] = ("loss",),
                   weights: Sequence[float] | None = None, sharded: bool = False) -> dict[str, float]:  # fmt: skip
    """One batch's backward pass: this process's share of ``rows``, then gradients averaged over processes.

    ``losses`` maps rows to their named mean losses (``names``), whose sum is
    minimised; returns each loss over the whole batch. A process can get no
    rows of a last, short batch; it still joins the average. With one
    process this is ``sum(losses(rows).values()).backward()``.

    ``sharded``: the model's weights are sharded (:func:`shard_model`), so its
    backward averages the gradients itself, and every process must run the
    forward and backward passes (they gather the weights): a process without
    rows runs one row with weight 0.
    """
    mine, share = shard(rows, weights)
    values = dict.fromkeys(names, 0.0)
    if sharded and not mine:
        mine, share = list(rows[:1]), 0.0
    if mine:
        parts = losses(mine)
        (sum(parts.values()) * share).backward()
        values = {k: float(v.detach()) * share for k, v in parts.items()}
    if not sharded:
        average_gradients(params)
    return {k: global_mean(values[k]) for k in names}


def shard_model(model: torch.nn.Module, blocks: Iterable[torch.nn.Module]) -> None:
    """Shard ``model``'s weights, and so its gradients and optimizer state, over the processes (ZeRO-3's layout).

    PyTorch's FSDP2 (``fully_shard``): each process keeps 1/N of every
    weight; each of ``blocks`` (a transformer layer, say) gathers its whole
    weights just before its forward and backward pass and frees them after,
    and the backward pass reduce-scatters the gradients, averaged over the
    processes, so each keeps only its shard's. An optimizer built on the
    parameters afterwards holds only its shard's state. What one process
    needs is then about 1/N of the weights, gradients and optimizer state,
    plus one block's whole weights and the activations. With one process
    this does nothing.
    """
    s = state()
    if s.num_processes == 1:
        return
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh(s.device.type, (s.num_processes,))
    for block in blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)


def full_weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The whole weights of a model sharded by :func:`shard_model`, on the CPU of the main process.

    Every process must call it (the shards are gathered); the others get an
    empty dict. Unsharded, the model's own state dict.
    """
    if state().num_processes == 1:
        return model.state_dict()
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
