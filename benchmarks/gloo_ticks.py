"""How long small gloo operations take one by one on this host: fast, or one scheduler tick.

On this project's 2-core VM a blocking gloo all-reduce of a few bytes to a few hundred KiB
takes about 0.2-0.7 ms or about 4 ms (one tick of a kernel built with ``CONFIG_HZ=250``, now
and then two), the slow calls coming in runs. This times, on 2 gloo ranks started by
trainsched's launcher (one thread each), every call of several operations, each
``--calls`` times per round over ``--rounds`` interleaved rounds, and prints per operation the
median, the mean and the share of calls over ``--slow-ms``:

- all-reduce at a few sizes, back to back;
- the same all-reduce after a barrier, and after a point-to-point round trip;
- broadcast (one way), send/recv ping-pong, isend + irecv both ways at once.

The mean is what a run of such calls pays, the median what a quiet call takes; where they are
far apart the slow share, not the size, sets the cost (RESULTS.md, *validate_sim*).

    python benchmarks/gloo_ticks.py
    python benchmarks/gloo_ticks.py --rounds 4 --calls 50 --out benchmarks/results/gloo_ticks.json
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

from _common import cpu_model, write_results

HERE = Path(__file__).resolve().parent
SIZES = (1024, 65536, 800_000)  # bytes: a bias, a small layer, the zoo MLP's whole gradient


def worker() -> None:  # pragma: no cover - runs in the ranks
    import time

    import torch
    import torch.distributed as dist

    cfg = json.loads(sys.argv[1])
    rank = cfg["rank"]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{cfg['port']}",
                            rank=rank, world_size=2)
    torch.set_num_threads(1)
    peer = 1 - rank
    small = torch.ones(256)
    ping = torch.zeros(1024, dtype=torch.uint8)

    def round_trip() -> None:
        if rank == 0:
            dist.send(ping, 1)
            dist.recv(ping, 1)
        else:
            dist.recv(ping, 0)
            dist.send(ping, 0)

    def both_ways() -> None:
        out = dist.isend(small.clone(), peer)
        back = dist.irecv(small, peer)
        out.wait()
        back.wait()

    ops = {}
    for size in SIZES:
        buf = torch.ones(max(1, size // 4))
        ops[f"all-reduce {size} B"] = (None, lambda b=buf: dist.all_reduce(b))
    mid = torch.ones(65536 // 4)
    ops["all-reduce 65536 B after a barrier"] = (dist.barrier, lambda: dist.all_reduce(mid))
    ops["all-reduce 65536 B after a round trip"] = (round_trip, lambda: dist.all_reduce(mid))
    ops["broadcast 1024 B"] = (None, lambda: dist.broadcast(small, 0))
    ops["send/recv round trip 1024 B"] = (None, round_trip)
    ops["isend + irecv both ways 1024 B"] = (None, both_ways)
    times: dict[str, list[float]] = {name: [] for name in ops}
    for _ in range(cfg["rounds"]):
        for name, (before, call) in ops.items():
            for i in range(cfg["calls"] + 3):
                if before is not None:
                    before()
                t0 = time.perf_counter()
                call()
                took = time.perf_counter() - t0
                if i >= 3:
                    times[name].append(took)
    if rank == 0:
        Path(cfg["out"], "times.json").write_text(json.dumps(times))
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds")
    parser.add_argument("--calls", type=int, default=40, help="timed calls per operation and round")
    parser.add_argument("--slow-ms", type=float, default=1.5,
                        help="a call over this many ms counts as slow")
    parser.add_argument("--out", default=str(HERE / "results" / "gloo_ticks.json"))
    args = parser.parse_args()
    from trainsched.runtime.launch import free_port, run_workers

    load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="gloo-ticks-") as tmp:
        port = free_port()
        configs = [{"rank": r, "port": port, "rounds": args.rounds, "calls": args.calls,
                    "out": tmp} for r in range(2)]
        run_workers(str(Path(__file__).resolve()), configs, workdir=Path(tmp), timeout_s=900)
        times = json.loads(Path(tmp, "times.json").read_text())
    rows = []
    print(f"{'operation (rank 0)':40s} {'median ms':>10s} {'mean ms':>8s} "
          f"{'slow calls':>12s}")
    for name, values in times.items():
        slow = sum(t > args.slow_ms / 1e3 for t in values)
        row = {"operation": name, "calls": len(values),
               "median_ms": statistics.median(values) * 1e3,
               "mean_ms": statistics.mean(values) * 1e3, "slow_calls": slow}
        rows.append(row)
        print(f"{name:40s} {row['median_ms']:10.3f} {row['mean_ms']:8.3f} "
              f"{slow:>5d}/{len(values):<6d}", flush=True)
    print(f"slow: over {args.slow_ms:g} ms; load average {load:.2f} before, "
          f"{os.getloadavg()[0]:.2f} after")
    write_results(args.out, {
        "benchmark": "gloo_ticks", "machine": cpu_model(), "python": platform.python_version(),
        "when": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "rounds": args.rounds, "calls": args.calls, "slow_ms": args.slow_ms,
        "load_before": load, "load_after": os.getloadavg()[0], "rows": rows,
        "times_s": times})


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1].startswith("{"):
        worker()
    else:
        main()
