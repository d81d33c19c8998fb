"""Distributed jobs for ``tests/test_ooo_data_parallel.py``: ``python tests/ooo_jobs.py CONFIG``.

Reverse-first-k (``backprop_k``) on the scheduled data-parallel runtime, in every rank of a
real gloo group (spawned by :func:`trainsched.runtime.launch.run_workers`); each job writes
``<out>/rank<r>.json`` with what it measured and the test asserts on it.
"""

from __future__ import annotations

import copy
import json
import sys
import time
import traceback
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from trainsched.comm import FifoPolicy, PriorityPolicy
from trainsched.errors import TrainschedError
from trainsched.runtime.data_parallel import ScheduledDataParallel

STEPS = 4
OPTIMIZERS = {
    "sgd": (torch.optim.SGD, {"lr": 0.05}),
    "momentum": (torch.optim.SGD, {"lr": 0.05, "momentum": 0.9}),
    "adam": (torch.optim.Adam, {"lr": 1e-2}),
}


class Net(nn.Module):
    """Four split layers (a conv, three linear; L = 4) and a LayerNorm that stays whole."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv1d(2, 4, 3, padding=1)
        self.fc1 = nn.Linear(24, 16)
        self.norm = nn.LayerNorm(16)
        self.fc2 = nn.Linear(16, 16)
        self.fc3 = nn.Linear(16, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.conv(x)).flatten(1)
        y = torch.relu(self.norm(self.fc1(y)))
        return self.fc3(torch.relu(self.fc2(y)))


class Tied(nn.Module):
    """An embedding tied to the output projection (the tied weight waits for both dW)."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(11, 6)
        self.mix = nn.Linear(6, 6)
        self.out = nn.Linear(6, 11, bias=False)
        self.out.weight = self.emb.weight

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.out(torch.tanh(self.mix(self.emb(idx))))


def net(kind: str = "net") -> nn.Module:
    torch.manual_seed(0)
    return Tied() if kind == "tied" else Net()


def batch(step: int, rank: int, kind: str = "net") -> torch.Tensor:
    g = torch.Generator().manual_seed(100 * step + rank)
    if kind == "tied":
        return torch.randint(0, 11, (3, 4), generator=g)
    return torch.randn(5, 2, 6, generator=g)


def loss_of(out: torch.Tensor) -> torch.Tensor:
    return out.square().mean()


def params(m: nn.Module) -> list[list[float]]:
    return [p.detach().flatten().tolist() for p in m.parameters()]


def train_plain(rank: int, world: int, optimizer: str, kind: str = "net",
                ) -> tuple[list[float], list]:
    """BSP: backward, all-reduce every gradient, divide, one optimizer step."""
    m = net(kind)
    cls, kwargs = OPTIMIZERS[optimizer]
    opt = cls(m.parameters(), **kwargs)
    losses = []
    for s in range(STEPS):
        opt.zero_grad()
        loss = loss_of(m(batch(s, rank, kind)))
        losses.append(loss.item())
        loss.backward()
        for p in m.parameters():
            dist.all_reduce(p.grad)
            p.grad.div_(world)
        opt.step()
    return losses, params(m)


def train_sdp(rank: int, k: int, optimizer: str, policy=None, steps: int = STEPS,
              kind: str = "net", **kw) -> tuple[list[float], list]:
    m = net(kind)
    cls, kwargs = OPTIMIZERS[optimizer]
    policy = policy or PriorityPolicy(cross_barrier=True)
    losses = []
    with ScheduledDataParallel(m, policy, optimizer=cls, optimizer_kwargs=kwargs,
                               timeout_s=60, backprop_k=k, **kw) as sdp:
        for s in range(steps):
            loss = loss_of(sdp(batch(s, rank, kind)))
            losses.append(loss.item())
            loss.backward()
        sdp.drain()
    return losses, params(m)


def issue_log(sdp: ScheduledDataParallel, delay_s: float = 0.0) -> list[list[str]]:
    """Test instrumentation: every collective this rank issues, per step (names); with
    ``delay_s`` the dispatcher sleeps before each issue, so that every gradient of the step
    is queued by the time it decides the next one."""
    log: list[list[str]] = []
    d = sdp._dispatch
    issue = d.issue

    def logged(c: int) -> None:
        if d.position == 0:
            log.append([])
        log[-1].append(d.names[c])
        if delay_s:
            time.sleep(delay_s)
        issue(c)

    d.issue = logged
    return log


def run_logged(rank: int, k: int, policy, delay_s: float = 0.0) -> list[list[str]]:
    m = net()
    with ScheduledDataParallel(m, policy, timeout_s=60, backprop_k=k) as sdp:
        log = issue_log(sdp, delay_s if rank == 0 else 0.0)
        for s in range(3):
            loss_of(sdp(batch(s, rank))).backward()
        sdp.drain()
    return log


def held_peaks(rank: int) -> dict[str, int]:
    """The deferred dW's peak held bytes for k = 0, 2, 4 (three steps each)."""
    peaks = {}
    for k in (0, 2, 4):
        with ScheduledDataParallel(net(), "priority", timeout_s=60, backprop_k=k) as sdp:
            for s in range(3):
                loss_of(sdp(batch(s, rank))).backward()
            sdp.drain()
            peaks[f"k{k}"] = sdp.dw_peak_held_bytes
    return peaks


def error_of(fn) -> str:
    try:
        fn()
    except TrainschedError as exc:
        return f"TrainschedError: {exc}"
    return "no error"


# --- jobs --------------------------------------------------------------------------------------


def job_equivalence(cfg: dict) -> dict:
    """N steps with k in {0, L/2, L} and three optimizers, against BSP."""
    rank, world = cfg["rank"], cfg["world_size"]
    out: dict = {}
    for opt in OPTIMIZERS:
        out[f"plain/{opt}"] = train_plain(rank, world, opt)
        for k in (0, 2, 4):
            out[f"k{k}/{opt}"] = train_sdp(rank, k, opt)
    # k = 0 is today's runtime: the same bits as the wrapper without the option
    out["k0_default/adam"] = train_sdp(rank, 0, "adam")
    out["static_order/k2"] = train_sdp(rank, 2, "adam", order="static")
    out["graph_backend/k4"] = train_sdp(rank, 4, "adam", split_backend="graph")
    out["partitions/k2"] = train_sdp(rank, 2, "adam", PriorityPolicy(
        partition_bytes=256, credit_bytes=1024, cross_barrier=True))
    out["tied/plain"] = train_plain(rank, world, "momentum", kind="tied")
    for k in (1, 3):
        out[f"tied/k{k}"] = train_sdp(rank, k, "momentum", kind="tied")
    return out


def job_order(cfg: dict) -> dict:
    """The issue order: FIFO issues as produced; priority lets layer 0 overtake."""
    rank = cfg["rank"]
    out = {f"fifo/k{k}": run_logged(rank, k, FifoPolicy(cross_barrier=True))
           for k in (0, 2, 4)}
    for k in (0, 2, 4):
        out[f"priority/k{k}"] = run_logged(rank, k, PriorityPolicy(cross_barrier=True),
                                           delay_s=0.1)
    return out


def job_checkpoint(cfg: dict) -> dict:
    """Drain and save mid-run, go on; restore into a new wrapper and redo the same steps."""
    rank = cfg["rank"]
    cls, kwargs = OPTIMIZERS["adam"]
    m = net()
    sdp = ScheduledDataParallel(m, PriorityPolicy(cross_barrier=True), optimizer=cls,
                                optimizer_kwargs=kwargs, timeout_s=60, backprop_k=2)
    for s in range(2):
        loss_of(sdp(batch(s, rank))).backward()
    sdp.drain()
    saved_model = {k: v.clone() for k, v in m.state_dict().items()}
    saved_opts = [copy.deepcopy(o.state_dict()) for o in sdp.optimizers]
    adam_steps = [float(st["step"]) for o in saved_opts for st in o["state"].values()]
    for s in range(2, 4):
        loss_of(sdp(batch(s, rank))).backward()
    sdp.close()
    going_on = params(m)
    restored = net()
    restored.load_state_dict(saved_model)
    sdp2 = ScheduledDataParallel(restored, PriorityPolicy(cross_barrier=True), optimizer=cls,
                                 optimizer_kwargs=kwargs, timeout_s=60, backprop_k=2)
    for o, state in zip(sdp2.optimizers, saved_opts, strict=True):
        o.load_state_dict(state)
    for s in range(2, 4):
        loss_of(sdp2(batch(s, rank))).backward()
    sdp2.close()
    # after close the module's own forwards are back: a plain backward fills .grad
    restored.zero_grad()
    loss_of(restored(batch(0, rank))).backward()
    return {"going_on": going_on, "restored": params(restored),
            "stock_grad_after_close": all(p.grad is not None for p in restored.parameters()),
            "adam_steps": adam_steps}


def job_refused(cfg: dict) -> dict:
    out = {"k_above": error_of(lambda: ScheduledDataParallel(net(), "priority", backprop_k=5)),
           "disabled": error_of(lambda: ScheduledDataParallel(net(), "priority", backprop_k=2,
                                                              enabled=False)),
           "negative": error_of(lambda: ScheduledDataParallel(net(), "priority",
                                                              backprop_k=-1))}
    class Outside(Net):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return super().forward(x) + self.fc3.bias.sum() * 0.5  # fc3.bias used outside

    for backend in ("auto", "graph"):
        torch.manual_seed(0)
        sdp = ScheduledDataParallel(Outside(), "priority", backprop_k=1, timeout_s=30,
                                    split_backend=backend)
        out[f"outside/{backend}"] = error_of(
            lambda sdp=sdp: loss_of(sdp(batch(0, cfg["rank"]))).backward())
        out[f"outside_close/{backend}"] = error_of(sdp.close)
    m = net()
    with ScheduledDataParallel(m, "priority", backprop_k=4, timeout_s=30) as sdp:
        out["ddp_inside"] = error_of(lambda: nn.parallel.DistributedDataParallel(m))
        loss_of(sdp(batch(0, cfg["rank"]))).backward()
    return out


def job_rest(cfg: dict) -> dict:
    """The order, the checkpoint and the refusals in one group (spawning is the slow part)."""
    return {"order": job_order(cfg), "checkpoint": job_checkpoint(cfg),
            "refused": job_refused(cfg), "held": held_peaks(cfg["rank"])}


JOBS = {"equivalence": job_equivalence, "order": job_order, "checkpoint": job_checkpoint,
        "refused": job_refused, "rest": job_rest}


def main() -> None:
    cfg = json.loads(sys.argv[1])
    rank = cfg["rank"]
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{cfg['port']}", rank=rank,
                            world_size=cfg["world_size"], timeout=timedelta(seconds=60))
    path = Path(cfg["out"]) / f"rank{rank}.json"
    try:
        result = JOBS[cfg["job"]](cfg)
    except Exception:
        result = {"crash": traceback.format_exc()}
    path.write_text(json.dumps(result))
    sys.stdout.flush()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
