"""Where a small model's DDP step goes on 2 gloo ranks: the parts timed one by one.

The simulator under-predicts DDP on the smallest models (``validate_sim``: the zoo MLP by 18-39%,
the small CNN by 19-21%). This times, in one 2-rank job (one thread each), interleaved over
``--rounds`` rounds of ``--steps`` steps after 5 untimed ones, per batch size:

- ``fwd_bwd``: forward and backward of the plain model, no optimizer;
- ``local``: a whole plain step (``zero_grad``, forward, backward, SGD ``step``), no comm;
- ``ddp_no_sync``: the same step on the DDP-wrapped model inside ``no_sync()`` (DDP's hooks
  and buffer broadcast, no gradient all-reduce);
- ``allreduce``: one blocking all-reduce of a flat buffer of every gradient (from a barrier);
- ``then_allreduce``: ``ddp_no_sync`` and then that all-reduce, in one timed step (so it
  includes each step's wait for the slower rank, as a DDP step does);
- ``ddp``: the whole DDP step.

``ddp`` minus (``ddp_no_sync`` + ``allreduce``) is what DDP's gradient synchronisation costs
beyond a blocking all-reduce of the same bytes. Rank 0's medians go to a table and to
``--out`` (JSON).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
CASES = ("fwd_bwd", "local", "ddp_no_sync", "allreduce", "then_allreduce", "ddp")


def worker() -> None:  # pragma: no cover - runs in the ranks
    import time

    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from trainsched.capture import zoo

    cfg = json.loads(sys.argv[1])
    rank = cfg["rank"]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{cfg['port']}", rank=rank,
                            world_size=2)
    built = zoo.build(cfg["model"], batch_size=cfg["batch"])
    model, inputs = built.model, built.args
    ddp = DistributedDataParallel(model)
    plain_opt = torch.optim.SGD(model.parameters(), lr=0.01)
    ddp_opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    flat = torch.zeros(sum(p.numel() for p in model.parameters()))

    def fwd_bwd() -> None:
        model(*inputs).float().pow(2).mean().backward()

    def local() -> None:
        plain_opt.zero_grad()
        fwd_bwd()
        plain_opt.step()

    def ddp_no_sync() -> None:
        ddp_opt.zero_grad()
        with ddp.no_sync():
            ddp(*inputs).float().pow(2).mean().backward()
        ddp_opt.step()

    def allreduce() -> None:
        dist.all_reduce(flat)

    def then_allreduce() -> None:
        ddp_no_sync()
        allreduce()

    def ddp_step() -> None:
        ddp_opt.zero_grad()
        ddp(*inputs).float().pow(2).mean().backward()
        ddp_opt.step()

    cases = dict(zip(CASES, (fwd_bwd, local, ddp_no_sync, allreduce, then_allreduce,
                              ddp_step), strict=True))
    times: dict[str, list[float]] = {k: [] for k in CASES}
    for _ in range(cfg["rounds"]):
        for name, step in cases.items():
            for _ in range(5):
                step()
            dist.barrier()
            for _ in range(cfg["steps"]):
                start = time.perf_counter()
                step()
                times[name].append(time.perf_counter() - start)
            dist.barrier()
    if rank == 0:
        out = {k: statistics.median(v) for k, v in times.items()}
        out["gradient_bytes"] = flat.numel() * 4
        Path(cfg["out"], "rank0.json").write_text(json.dumps(out))
    dist.destroy_process_group()


def main() -> None:
    sys.path.insert(0, str(HERE))
    from _common import cpu_model, write_results
    from trainsched.runtime.launch import free_port, run_workers

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="mlp")
    ap.add_argument("--batches", type=int, nargs="+", default=[16, 64, 256])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--out", default=str(HERE / "results" / "ddp_overhead.json"))
    args = ap.parse_args()
    load_before = os.getloadavg()[0]
    rows = []
    print(f"{args.model}, 2 gloo ranks, medians of {args.rounds} x {args.steps} steps (ms)")
    print(f"{'batch':>5} " + " ".join(f"{c:>12}" for c in CASES) + f" {'ddp - parts':>12}")
    for batch in args.batches:
        with tempfile.TemporaryDirectory(prefix="ddp-overhead-") as tmp:
            port = free_port()
            configs = [{"rank": r, "port": port, "batch": batch, "model": args.model,
                        "rounds": args.rounds, "steps": args.steps, "out": tmp}
                       for r in range(2)]
            run_workers(__file__, configs, workdir=Path(tmp), timeout_s=900)
            row = json.loads(Path(tmp, "rank0.json").read_text())
        row["batch"] = batch
        row["ddp_beyond_parts"] = row["ddp"] - row["ddp_no_sync"] - row["allreduce"]
        rows.append(row)
        print(f"{batch:>5} " + " ".join(f"{row[c] * 1e3:>12.2f}" for c in CASES)
              + f" {row['ddp_beyond_parts'] * 1e3:>12.2f}", flush=True)
    write_results(args.out, {
        "benchmark": "ddp_overhead", "model": args.model,
        "when": datetime.datetime.now(datetime.timezone.utc).isoformat(),
        "machine": {"cpu": cpu_model(), "cores": os.cpu_count(),
                    "python": platform.python_version()},
        "load_before": load_before, "load_after": os.getloadavg()[0], "rows": rows})


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1].startswith("{"):
        worker()
    else:
        main()
