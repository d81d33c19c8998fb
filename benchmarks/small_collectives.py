"""Small gloo all-reduces on this host, issued the ways the runtimes issue them (issue 16).

The scheduled data-parallel runtime reduces a small model's gradients one collective per
tensor or fused group, from its dispatcher thread, with completion coming back through each
work's future; `compare --run` measures its FIFO row on the zoo MLP (8 tensors, 0.8 MB) at about
twice what the simulator predicts. This times, in one 2-rank gloo job (one thread each),
interleaved over ``--rounds`` rounds of ``--repeats`` repetitions, the all-reduce of one set of
tensors (default: the zoo MLP's gradients) issued

- ``serial``: one blocking ``all_reduce`` after another;
- ``chain``: one at a time from a second thread, each issued when the completion callback of
  the one before has woken that thread (what the scheduled runtime does under a policy that
  lets one collective be in flight, FIFO); ``chain`` minus ``serial`` is the hand-off;
- ``burst``: all issued at once (``async_op=True``), then each waited for;
- ``thread``: all issued at once from a second thread, each completion posted to a queue by a
  callback on its future, the main thread waiting on the queue (as the scheduled runtime does);
- ``flat``: one all-reduce of one buffer holding every tensor (what DDP's single bucket does;
  the copies in and out are not timed);

each repetition started from a barrier. Rank 0's medians go to a table and to ``--out``. With
``--calibration FILE`` (a cluster file from ``trainsched calibrate``) the table also shows what
its all-reduce line (the ring formula over its per-rank latency and bandwidth) says the tensors
cost one after another.

    python benchmarks/small_collectives.py                 # about 1 minute
    python benchmarks/small_collectives.py --calibration local.json
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
MODES = ("serial", "chain", "burst", "thread", "flat")


def worker() -> None:  # pragma: no cover - runs in the ranks
    import queue
    import threading
    import time

    import torch
    import torch.distributed as dist

    from trainsched.capture import zoo

    cfg = json.loads(sys.argv[1])
    rank = cfg["rank"]
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{cfg['port']}", rank=rank,
                            world_size=2)
    model = zoo.build(cfg["model"], batch_size=1).model
    tensors = [torch.ones(p.numel()) for p in model.parameters()]
    flat = torch.ones(sum(t.numel() for t in tensors))
    done: queue.SimpleQueue[int] = queue.SimpleQueue()

    def issue_from_thread() -> None:
        for t in tensors:
            work = dist.all_reduce(t, async_op=True)
            work.get_future().add_done_callback(lambda _f: done.put(1))

    def chain_from_thread() -> None:
        woken: queue.SimpleQueue[int] = queue.SimpleQueue()
        for t in tensors:
            work = dist.all_reduce(t, async_op=True)
            work.get_future().add_done_callback(lambda _f: woken.put(1))
            woken.get()
        done.put(1)

    def once(mode: str) -> float:
        dist.barrier()
        t0 = time.perf_counter()
        if mode == "serial":
            for t in tensors:
                dist.all_reduce(t)
        elif mode == "chain":
            issuer = threading.Thread(target=chain_from_thread)
            issuer.start()
            done.get()
            issuer.join()
        elif mode == "burst":
            for work in [dist.all_reduce(t, async_op=True) for t in tensors]:
                work.wait()
        elif mode == "thread":
            issuer = threading.Thread(target=issue_from_thread)
            issuer.start()
            for _ in tensors:
                done.get()
            issuer.join()
        else:
            dist.all_reduce(flat)
        return time.perf_counter() - t0

    for mode in MODES:  # untimed warm-up
        for _ in range(cfg["warmup"]):
            once(mode)
    times: dict[str, list[list[float]]] = {m: [] for m in MODES}
    for _ in range(cfg["rounds"]):
        for mode in MODES:
            times[mode].append([once(mode) for _ in range(cfg["repeats"])])
    if rank == 0:
        Path(cfg["out"]).write_text(json.dumps(
            {"times": times, "sizes_bytes": [t.numel() * 4 for t in tensors]}))
    dist.barrier()
    dist.destroy_process_group()


def line_prediction(cluster_file: str, sizes: list[int]) -> float:
    """The calibrated all-reduce line's time for ``sizes`` one after another (2 ranks)."""
    from trainsched.cluster import load_cluster_file

    link = load_cluster_file(cluster_file).collective_link
    n = 2
    return sum(2 * (n - 1) * link.latency_s + 2 * (n - 1) / n * s / link.bandwidth_bytes_per_s
               for s in sizes)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="mlp", help="a zoo model: its gradients' sizes")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=40)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--calibration", help="a cluster file from trainsched calibrate")
    parser.add_argument("--out", default=str(HERE / "results" / "small_collectives.json"))
    args = parser.parse_args()
    from trainsched.runtime.launch import free_port, run_workers

    load_before = Path("/proc/loadavg").read_text().split()[:3]
    began = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp, "rank0.json")
        port = free_port()
        configs = [{"rank": r, "port": port, "model": args.model, "rounds": args.rounds,
                    "repeats": args.repeats, "warmup": args.warmup, "out": str(out)}
                   for r in range(2)]
        run_workers(str(Path(__file__).resolve()), configs, workdir=Path(tmp), timeout_s=900,
                    env={"OMP_NUM_THREADS": "1"})
        measured = json.loads(out.read_text())
    sizes = measured["sizes_bytes"]
    line = line_prediction(args.calibration, sizes) if args.calibration else None
    rows = {}
    print(f"{args.model}: {len(sizes)} tensors, {sum(sizes) / 1e6:.2f} MB, 2 gloo ranks; "
          f"medians of {args.rounds} rounds x {args.repeats}")
    print(f"{'mode':<8} {'median ms':>10} {'per tensor':>11}  round medians (ms)"
          + ("   line / measured" if line else ""))
    for mode in MODES:
        rounds = [statistics.median(r) for r in measured["times"][mode]]
        med = statistics.median(rounds)
        rows[mode] = {"median_s": med, "round_medians_s": rounds,
                      "per_tensor_s": med / (1 if mode == "flat" else len(sizes))}
        tail = f"   {line / med:.2f}x" if line and mode != "flat" else ""
        print(f"{mode:<8} {med * 1e3:>10.2f} {rows[mode]['per_tensor_s'] * 1e3:>11.3f}  "
              + " ".join(f"{r * 1e3:.2f}" for r in rounds) + tail)
    if line:
        print(f"the calibration's all-reduce line, one after another: {line * 1e3:.2f} ms")
    load_after = Path("/proc/loadavg").read_text().split()[:3]
    print(f"load average before {' '.join(load_before)}, after {' '.join(load_after)}")
    write_results(args.out, {
        "benchmark": "small_collectives", "date": began, "machine": cpu_model(),
        "cores": os.cpu_count(), "python": platform.python_version(), "model": args.model,
        "sizes_bytes": sizes, "rounds": args.rounds, "repeats": args.repeats,
        "calibration": args.calibration, "line_serial_s": line, "modes": rows,
        "loadavg_before": load_before, "loadavg_after": load_after})
    return 0


if __name__ == "__main__":
    if len(sys.argv) == 2 and sys.argv[1].startswith("{"):  # a rank started by run_workers
        worker()
    else:
        raise SystemExit(main())
