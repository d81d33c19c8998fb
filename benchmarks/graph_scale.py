"""How long loading, ``show`` and a one-device simulation take on graphs of 10k to 1M ops.

The workload is a synthetic training graph written without torch, as ``Graph.save`` wrote it
in the ``trainsched.graph/1`` format (every field of every op, one op or edge per line): a deep
pre-norm transformer, block after block of ``ln1 -> qkv -> attn -> proj -> add1 (skip from the
block input) -> ln2 -> fc1 -> gelu -> fc2 -> add2 (skip from add1)``, GPT-2-small sized (hidden
768, 12 heads, batch 8 x 1,024 tokens, fp32), between an embedding and a head. Matmuls cost
their FLOPs at 60 TFLOP/s, the other ops their bytes at 3 TB/s (H100-like, roofline tier). The
training ops follow the rules of :func:`trainsched.graph.to_training` (``v:dX`` for every op
after the embedding, ``v:dW`` and ``v:opt`` for every op with parameters, saved-activation,
gradient and update edges): 32 ops per block, so a graph of N ops has about N / 32 blocks.

Each graph is measured in up to three files (``--formats`` picks): ``compact``, the
``trainsched.graph/2`` file ``Graph.save`` writes (columns, strings once, default columns left
out), made from the generated file by ``Graph.load`` + ``Graph.save``; ``binary``, the
``trainsched.graph/3`` file (``.tsg``) made the same way; and ``v1``, the generated
``trainsched.graph/1`` file, as trainsched wrote graphs before.

Cases, each in a fresh Python process (wall and CPU time measured inside it, imports included:
on a shared machine the CPU time is the steadier figure; peak memory
from ``/proc/self/status`` VmHWM, else ``resource.getrusage(RUSAGE_SELF).ru_maxrss``, which on
Linux keeps the forking parent's peak across ``exec``):

- ``load``: ``Graph.load(file)``;
- ``show``: ``trainsched show FILE`` (the CLI, output thrown away);
- ``simulate-cli``: ``trainsched simulate FILE --cluster dgx-h100 --json``;
- ``simulate-lib``: ``Graph.load`` then ``simulate_single(graph, cluster)``.

The 1M-op case runs with ``--big``. Goal (issue 16): a 1M-op one-device simulation under 10 s
and 2 GB, memory growing no faster than the file. Results: a table on stdout and a JSON file
(``--out``), quoted in benchmarks/RESULTS.md with the machine and its load.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

from _common import cpu_model, write_results

HIDDEN = 768
HEADS = 12
TOKENS = 8 * 1024  # batch 8, sequence 1,024
VOCAB = 50_257
FP32 = 4
MATMUL_FLOPS_PER_S = 60e12
MEMORY_BYTES_PER_S = 3e12
LAUNCH_S = 4e-6
OPS_PER_BLOCK = 32
SIZES = (10_000, 100_000)
BIG = 1_000_000
CLUSTER = "dgx-h100"
CASES = ("load", "show", "simulate-cli", "simulate-lib")
FORMATS = ("compact", "binary", "v1")

# Every Op field with its default, in the order the file sorts them (the writer sorts keys).
_DEFAULTS = {
    "backward_input_flops": None, "backward_input_p10_s": None, "backward_input_p90_s": None,
    "backward_input_s": None, "backward_weight_flops": None, "backward_weight_p10_s": None,
    "backward_weight_p90_s": None, "backward_weight_s": None, "buffer_bytes": 0,
    "bytes_accessed": 0, "compute_p10_s": None, "compute_p90_s": None, "compute_s": 0.0,
    "flops": 0.0, "forward_op": None, "group": None, "kind": "forward", "layer_index": None,
    "members": [], "module_path": "", "name": "", "optimizer_state_bytes": 0,
    "output_bytes": 0, "param_bytes": 0, "samples": 0, "saved_bytes": 0, "target": "",
    "temp_bytes": 0, "tied_to": [],
}  # fmt: skip


def _dump(value: object) -> str:
    return json.dumps(value, sort_keys=True, separators=(", ", ": "), allow_nan=False)


class _Forward:
    """The forward ops (records of non-default fields) and edges of the synthetic model."""

    def __init__(self) -> None:
        self.ops: list[dict] = []
        self.by_name: dict[str, dict] = {}
        self.edges: list[tuple[str, str, int]] = []
        self.layers = 0

    def add(self, name: str, inputs: list[str], *, target: str, module: str, out_elems: int,
            params: int = 0, flops: float = 0.0, saved_elems: int = 0) -> str:
        out_bytes = out_elems * FP32
        moved = out_bytes + sum(self._out(x) for x in inputs) + params * FP32
        compute_s = LAUNCH_S + (flops / MATMUL_FLOPS_PER_S if flops else
                                moved / MEMORY_BYTES_PER_S)
        op = {"name": name, "compute_s": compute_s, "flops": flops, "bytes_accessed": moved,
              "param_bytes": params * FP32, "output_bytes": out_bytes,
              "saved_bytes": saved_elems * FP32, "module_path": module, "target": target}
        if params:
            op["layer_index"], self.layers = self.layers, self.layers + 1
            op["backward_input_flops"] = op["backward_weight_flops"] = flops
        self.ops.append(op)
        self.by_name[name] = op
        self.edges += [(x, name, self._out(x)) for x in inputs]
        return name

    def _out(self, name: str) -> int:
        return self.by_name[name]["output_bytes"]

    def linear(self, name: str, x: str, cin: int, cout: int, module: str) -> str:
        flops = 2.0 * TOKENS * cin * cout
        return self.add(name, [x], target="aten.linear.default", module=module,
                        out_elems=TOKENS * cout, params=cin * cout + cout, flops=flops,
                        saved_elems=TOKENS * cin)

    def block(self, i: int, x: str) -> str:
        p = f"h.{i}"
        d = HIDDEN
        ln1 = self.add(f"{p}.ln_1", [x], target="aten.layer_norm.default", module=f"{p}.ln_1",
                       out_elems=TOKENS * d, params=2 * d, saved_elems=TOKENS * d)
        qkv = self.linear(f"{p}.attn.c_attn", ln1, d, 3 * d, f"{p}.attn.c_attn")
        attn_flops = 4.0 * TOKENS * 1024 * d
        attn = self.add(f"{p}.attn.sdpa", [qkv],
                        target="aten.scaled_dot_product_attention.default", module=f"{p}.attn",
                        out_elems=TOKENS * d, flops=attn_flops, saved_elems=TOKENS * 4 * d)
        proj = self.linear(f"{p}.attn.c_proj", attn, d, d, f"{p}.attn.c_proj")
        add1 = self.add(f"{p}.add", [x, proj], target="aten.add.Tensor", module=p,
                        out_elems=TOKENS * d)
        ln2 = self.add(f"{p}.ln_2", [add1], target="aten.layer_norm.default",
                       module=f"{p}.ln_2", out_elems=TOKENS * d, params=2 * d,
                       saved_elems=TOKENS * d)
        fc1 = self.linear(f"{p}.mlp.c_fc", ln2, d, 4 * d, f"{p}.mlp.c_fc")
        gelu = self.add(f"{p}.mlp.gelu", [fc1], target="aten.gelu.default", module=f"{p}.mlp",
                        out_elems=TOKENS * 4 * d, saved_elems=TOKENS * 4 * d)
        fc2 = self.linear(f"{p}.mlp.c_proj", gelu, 4 * d, d, f"{p}.mlp.c_proj")
        return self.add(f"{p}.add_1", [add1, fc2], target="aten.add.Tensor", module=p,
                        out_elems=TOKENS * d)


def forward_model(num_ops: int) -> _Forward:
    """The forward part of the synthetic transformer whose training graph has about
    ``num_ops`` ops (embedding, ``num_ops // 32`` blocks, final norm, head)."""
    f = _Forward()
    x = f.add("wte", [], target="aten.embedding.default", module="wte",
              out_elems=TOKENS * HIDDEN, params=VOCAB * HIDDEN)
    for i in range(max(1, (num_ops - 8) // OPS_PER_BLOCK)):
        x = f.block(i, x)
    x = f.add("ln_f", [x], target="aten.layer_norm.default", module="ln_f",
              out_elems=TOKENS * HIDDEN, params=2 * HIDDEN, saved_elems=TOKENS * HIDDEN)
    f.linear("lm_head", x, HIDDEN, VOCAB, "lm_head")
    return f


def write_training_graph(num_ops: int, path: Path) -> tuple[int, int]:
    """Write the training graph of about ``num_ops`` ops to ``path`` in the file layout
    ``Graph.save`` writes (checked in :func:`check_layout`); returns (ops, edges)."""
    f = forward_model(num_ops)
    fwd = f.ops
    preds: dict[str, list[tuple[str, int]]] = {op["name"]: [] for op in fwd}
    for src, dst, size in f.edges:
        preds[dst].append((src, size))
    requires_grad, has_dx, grad_bytes = {}, {}, {}
    for op in fwd:  # listed in topological order
        v = op["name"]
        has_dx[v] = any(requires_grad[u] for u, _ in preds[v])
        requires_grad[v] = has_dx[v] or op["param_bytes"] > 0
        grad_bytes[v] = {}
        if has_dx[v]:
            for u, size in preds[v]:
                if requires_grad[u]:
                    grad_bytes[v][u] = grad_bytes[v].get(u, 0) + size
    derived = {"group": None, "forward_op": None}
    backward, grads = [], {}
    for op in reversed(fwd):
        v = op["name"]
        mine = []
        common = {"module_path": op["module_path"], "layer_index": op.get("layer_index"),
                  "group": v, "forward_op": v, "target": op["target"],
                  "bytes_accessed": op["bytes_accessed"]}
        for kind, suffix, out, flops_key in (
                ("backward_input", "dX", sum(grad_bytes[v].values()), "backward_input_flops"),
                ("backward_weight", "dW", op["param_bytes"], "backward_weight_flops")):
            if (kind == "backward_input" and has_dx[v]) or (kind == "backward_weight" and out):
                bflops = op.get(flops_key)
                cost = (op["compute_s"] * bflops / op["flops"] if op["flops"] and bflops
                        is not None else op["compute_s"])
                mine.append({**derived, **common, "name": f"{v}:{suffix}", "kind": kind,
                             "compute_s": cost, "flops": bflops if bflops is not None
                             else op["flops"], "output_bytes": out})
        backward += mine
        grads[v] = [b["name"] for b in mine]
    optim = []
    for op in fwd:
        if op["param_bytes"]:
            accessed = 3 * op["param_bytes"]  # SGD: read param and grad, write param
            optim.append({"name": f"{op['name']}:opt", "kind": "optimizer",
                          "compute_s": accessed / 10e9, "bytes_accessed": accessed,
                          "module_path": op["module_path"], "target": "sgd",
                          "layer_index": op.get("layer_index"), "group": op["name"],
                          "forward_op": op["name"]})
    for op in fwd:
        op["group"] = op["name"]
    edges = [(s, d, size, s) for s, d, size in f.edges]
    edges += [(op["name"], b, op["saved_bytes"], f"{op['name']}:saved")
              for op in fwd for b in grads[op["name"]]]
    edges += [(f"{c['name']}:dX", b, size, f"{c['name']}:dX>{u}")
              for c in reversed(fwd) for u, size in grad_bytes[c["name"]].items()
              for b in grads[u]]
    edges += [(f"{op['name']}:dW", f"{op['name']}:opt", op["param_bytes"], f"{op['name']}:grad")
              for op in fwd if op["param_bytes"]]
    ops = [*fwd, *backward, *optim]
    meta = {"model": f"synthetic-transformer-{len(ops)}", "batch_size": 8, "seq_len": 1024,
            "tier": "roofline", "device": "H100-80GB", "precision": "fp32",
            "training": {"optimizer": "sgd", "memory_bandwidth_bytes_per_s": 10e9}}
    with open(path, "w", encoding="utf-8") as out:
        out.write(f'{{"format": "trainsched.graph/1",\n"meta": {_dump(meta)},\n"ops": [')
        for k, op in enumerate(ops):
            out.write("\n  " + _dump({**_DEFAULTS, **op}) + ("," if k < len(ops) - 1 else "\n"))
        out.write('],\n"edges": [')
        for k, (s, d, size, tensor) in enumerate(edges):
            text = _dump({"dst": d, "size_bytes": size, "src": s, "tensor": tensor})
            out.write("\n  " + text + ("," if k < len(edges) - 1 else "\n"))
        out.write("]}\n")
    return len(ops), len(edges)


def check_layout(path: Path) -> None:
    """The generated file is exactly what ``Graph.save`` writes for the graph it holds in the
    ``trainsched.graph/1`` format."""
    from trainsched.graph import FORMAT_V1, Graph

    text = path.read_text()
    assert Graph.from_json(text).to_json(format=FORMAT_V1) == text, \
        f"{path}: not in Graph.save's layout"


def write_compact(v1: Path, path: Path) -> None:
    """The graph of ``v1`` saved as ``Graph.save`` writes it to ``path`` (the compact format,
    or the binary one for a ``.tsg`` path), in a fresh process (its memory goes when it ends)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": str(Path(__file__).resolve().parents[1] / "src")}
    code = ("import sys\nfrom trainsched.graph import Graph\n"
            "Graph.load(sys.argv[1]).save(sys.argv[2])\n")
    subprocess.run([sys.executable, "-c", code, str(v1), str(path)], env=env, check=True)


_CHILD = r"""
import io, json, resource, sys, time, contextlib
began = time.perf_counter()
case, path, cluster = sys.argv[1:4]
out = io.StringIO()
if case == "load":
    from trainsched.graph import Graph
    Graph.load(path)
elif case == "simulate-lib":
    from trainsched.cluster import resolve_cluster
    from trainsched.graph import Graph
    from trainsched.sim import simulate_single
    step = simulate_single(Graph.load(path), resolve_cluster(cluster)).step_time_s
    out.write(repr(step))
else:
    from trainsched.cli import main
    argv = ["show", path] if case == "show" else ["simulate", path, "--cluster", cluster, "--json"]
    with contextlib.redirect_stdout(out):
        assert main(argv) == 0
    if case == "simulate-cli":
        out = io.StringIO(repr(json.loads(out.getvalue())["step_time_s"]))
wall = time.perf_counter() - began
usage = resource.getrusage(resource.RUSAGE_SELF)
cpu = usage.ru_utime + usage.ru_stime
rss = usage.ru_maxrss * 1024
try:  # ru_maxrss keeps the forking parent's peak across exec; VmHWM starts afresh
    with open("/proc/self/status") as status:
        rss = next(int(ln.split()[1]) * 1024 for ln in status if ln.startswith("VmHWM:"))
except (OSError, StopIteration):
    pass
print(json.dumps({"wall_s": wall, "cpu_s": cpu, "peak_rss_bytes": rss,
                  "answer": out.getvalue()[:80]}))
"""


def run_case(case: str, path: Path, timeout_s: float) -> dict:
    """One case in a fresh interpreter; its wall time, peak RSS and answer (the step time)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": str(Path(__file__).resolve().parents[1] / "src")}
    try:
        proc = subprocess.run([sys.executable, "-c", _CHILD, case, str(path), CLUSTER],
                              capture_output=True, text=True, env=env, timeout=timeout_s,
                              check=False)
    except subprocess.TimeoutExpired:
        return {"wall_s": None, "cpu_s": None, "peak_rss_bytes": None,
                "answer": f"timeout {timeout_s:g}s"}
    if proc.returncode != 0:
        tail = proc.stderr.strip().splitlines()[-1:] or ["?"]
        return {"wall_s": None, "cpu_s": None, "peak_rss_bytes": None,
                "answer": f"failed: {tail[0][:60]}"}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _load() -> str:
    return Path("/proc/loadavg").read_text().split()[0] if Path("/proc/loadavg").exists() \
        else "?"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--big", action="store_true", help="also the 1M-op graph")
    p.add_argument("--sizes", type=int, nargs="*", default=None, help="graph sizes (ops)")
    p.add_argument("--cases", nargs="*", default=list(CASES), choices=CASES)
    p.add_argument("--formats", nargs="*", default=list(FORMATS), choices=FORMATS,
                   help="graph files to read: compact (trainsched.graph/2), binary "
                   "(trainsched.graph/3, .tsg), v1 (the old one)")
    p.add_argument("--dir", default=None, help="where the graph files go (default: a temp dir)")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds per case")
    p.add_argument("--label", default="", help="a note stored with the results (e.g. before)")
    p.add_argument("--out", default=str(Path(__file__).parent / "results" / "graph_scale.json"))
    args = p.parse_args()
    sizes = args.sizes or [*SIZES, *([BIG] if args.big else [])]
    work = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="graph_scale."))
    work.mkdir(parents=True, exist_ok=True)
    rows = []
    print(f"{'ops':>9} {'edges':>9} {'format':<7} {'file':>8} {'case':<13} {'wall s':>8} "
          f"{'cpu s':>7} {'peak RSS':>9} {'RSS/file':>8} {'load':>5}  answer")
    for size in sizes:
        v1 = work / f"transformer_{size}.v1.json"
        if not v1.exists():
            write_training_graph(size, v1)
        if size <= 10_000:
            check_layout(v1)
        paths = {"v1": v1, "compact": work / f"transformer_{size}.json",
                 "binary": work / f"transformer_{size}.tsg"}
        for form in ("compact", "binary"):
            if form in args.formats and not paths[form].exists():
                write_compact(v1, paths[form])
        num_ops = sum(1 for line in v1.open() if line.startswith('  {"backward_input_flops"'))
        num_edges = sum(1 for line in v1.open() if line.startswith('  {"dst"'))
        for form in args.formats:
            path = paths[form]
            file_bytes = path.stat().st_size
            for case in args.cases:
                load_before = _load()
                r = run_case(case, path, args.timeout)
                rss = r["peak_rss_bytes"]
                rows.append({"ops": num_ops, "edges": num_edges, "format": form,
                             "file_bytes": file_bytes, "case": case,
                             "load_before": float(load_before), **r})
                wall = f"{r['wall_s']:.2f}" if r["wall_s"] is not None else "-"
                cpu = f"{r['cpu_s']:.2f}" if r.get("cpu_s") is not None else "-"
                mem = f"{rss / 2**20:.0f}Mi" if rss else "-"
                ratio = f"{rss / file_bytes:.2f}" if rss else "-"
                print(f"{num_ops:>9} {num_edges:>9} {form:<7} {file_bytes / 2**20:>6.0f}Mi "
                      f"{case:<13} {wall:>8} {cpu:>7} {mem:>9} {ratio:>8} {load_before:>5}  "
                      f"{r['answer']}")
    write_results(args.out, {
        "benchmark": "graph_scale", "label": args.label,
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": {"cpu": cpu_model(), "cpus": os.cpu_count(), "python": platform.python_version(),
                    "platform": platform.platform()},
        "cluster": CLUSTER, "goal": {"ops": BIG, "wall_s": 10.0, "peak_rss_bytes": 2 * 10**9},
        "rows": rows,
    })
    return 0


if __name__ == "__main__":
    sys.exit(main())
