"""Devices, links, clusters: catalogue, presets, files, flags."""

import copy
import json
import pickle
from dataclasses import replace

import pytest

from trainsched.cluster import (
    DEVICE_KINDS,
    FORMAT,
    PRESETS,
    Cluster,
    DeviceSpec,
    Link,
    cluster_from_flags,
    cluster_preset,
    device_kind,
    load_cluster_file,
    resolve_cluster,
)
from trainsched.errors import TrainschedError

LINK = Link(bandwidth_bytes_per_s=5.7e9, latency_s=134e-6)
NET = Link(bandwidth_bytes_per_s=3.125e9, latency_s=50e-6)

EXAMPLE_TOML = """\
format = "trainsched.cluster/1"
name = "lab"
comm = "sequential"          # or "parallel"
nodes = 1
[device]
kind = "RTX2080"             # optional: a catalogue kind; fields below override it
count = 4                    # devices per node
memory = "8GiB"
peak_flops = "10TFLOP/s"
memory_bandwidth = "448GB/s"
launch_overhead = "5us"
[intra_node]
bandwidth = "5.7GB/s"
latency = "134us"
[inter_node]                 # required when nodes > 1
bandwidth = "25Gbit/s"
latency = "50us"
[parameter_servers]          # optional
count = 1
bandwidth = "10Gbit/s"
latency = "50us"
"""


def make_cluster(**overrides) -> Cluster:
    fields = dict(name="t", device=device_kind("V100"), devices_per_node=4, intra_node=LINK)
    return Cluster(**{**fields, **overrides})


# --- device catalogue ---------------------------------------------------------------------

@pytest.mark.parametrize(
    ("alias", "kind"),
    [("V100", "V100-16GB"), ("v100-16gb", "V100-16GB"), ("A100", "A100-80GB"),
     ("h100", "H100-80GB"), ("RTX2080", "RTX2080-8GB"), ("rtx 2080", "RTX2080-8GB"),
     ("K80", "K80-12GB"), ("cpu", "cpu"), ("CPU", "cpu")],
)
def test_device_kind_aliases(alias, kind):
    assert device_kind(alias).kind == kind


def test_device_kind_unknown_lists_known():
    with pytest.raises(TrainschedError, match=r"unknown device kind 'TPUv9'.*V100-16GB.*H100-80GB"):
        device_kind("TPUv9")


def test_datasheet_numbers():
    v100, h100 = DEVICE_KINDS["V100-16GB"], DEVICE_KINDS["H100-80GB"]
    assert v100.memory_bytes == 16 * 2**30
    assert v100.peak_flops("fp32") == 15.7e12 and v100.peak_flops("fp16") == 125e12
    assert h100.peak_flops("bf16") == 989.4e12 and h100.memory_bandwidth_bytes_per_s == 3.35e12
    assert DEVICE_KINDS["RTX2080-8GB"].memory_bandwidth_bytes_per_s == 448e9
    assert DEVICE_KINDS["K80-12GB"].memory_bytes == 12 * 2**30
    assert DEVICE_KINDS["A100-80GB"].peak_flops("tf32") == 156e12
    assert all(d.launch_overhead_s == 5e-6 for k, d in DEVICE_KINDS.items() if k != "cpu")


def test_peak_flops_falls_back_to_fp32():
    k80 = device_kind("K80")
    assert k80.peak_flops("bf16") == k80.peak_flops("fp32") == 4.37e12
    assert device_kind("V100").peak_flops("tf32") == 15.7e12
    with pytest.raises(TrainschedError, match="unknown dtype 'int8'"):
        k80.peak_flops("int8")


def test_device_spec_is_immutable_hashable_picklable():
    dev = DeviceSpec(kind="x", memory_bytes=10, peak_flops_per_s={"fp16": 2.0, "fp32": 1},
                     memory_bandwidth_bytes_per_s=3)
    assert list(dev.peak_flops_per_s) == ["fp32", "fp16"]
    with pytest.raises(TypeError):
        dev.peak_flops_per_s["fp32"] = 5.0  # type: ignore[index]
    assert pickle.loads(pickle.dumps(dev)) == dev
    assert copy.deepcopy(dev) == dev
    assert hash(dev) == hash(replace(dev))
    cluster = cluster_preset("dgx-h100")
    assert pickle.loads(pickle.dumps(cluster)) == cluster
    assert hash(cluster) == hash(cluster_preset("dgx-h100"))


@pytest.mark.parametrize(
    ("fields", "problem"),
    [({"memory_bytes": 0}, "memory_bytes must be a positive integer"),
     ({"memory_bytes": 1.5}, "memory_bytes must be a positive integer"),
     ({"peak_flops_per_s": {"fp16": 1.0}}, "must include 'fp32'"),
     ({"peak_flops_per_s": {"fp32": 1.0, "fp8": 2.0}}, "unknown dtype(s) 'fp8'"),
     ({"peak_flops_per_s": {"fp32": 0.0}}, "fp32 must be > 0"),
     ({"memory_bandwidth_bytes_per_s": float("inf")}, "memory bandwidth must be > 0"),
     ({"launch_overhead_s": -1.0}, "launch overhead must be >= 0")],
)
def test_device_spec_validation(fields, problem):
    base = dict(kind="x", memory_bytes=10, peak_flops_per_s={"fp32": 1.0},
                memory_bandwidth_bytes_per_s=3.0)
    with pytest.raises(TrainschedError) as info:
        DeviceSpec(**{**base, **fields})
    assert problem in str(info.value)


@pytest.mark.parametrize(
    ("fields", "problem"),
    [({"bandwidth_bytes_per_s": 0, "latency_s": 0}, "bandwidth must be > 0"),
     ({"bandwidth_bytes_per_s": 1, "latency_s": -1}, "latency must be >= 0"),
     ({"bandwidth_bytes_per_s": float("nan"), "latency_s": 0}, "bandwidth must be > 0")],
)
def test_link_validation(fields, problem):
    with pytest.raises(TrainschedError, match=problem):
        Link(**fields)


# --- cluster ------------------------------------------------------------------------------

@pytest.mark.parametrize(
    ("fields", "problem"),
    [({"devices_per_node": 0}, "devices per node must be a positive integer"),
     ({"num_nodes": 0}, "nodes must be a positive integer"),
     ({"comm": "fast"}, "comm must be 'sequential' or 'parallel', got 'fast'"),
     ({"num_nodes": 2}, "2 nodes need an inter-node link"),
     ({"parameter_servers": 2}, "2 parameter servers need a link"),
     ({"parameter_servers": -1}, "parameter servers must be a count >= 0"),
     ({"ps_link": NET}, "a parameter-server link is given but no parameter servers"),
     ({"name": ""}, "needs a name")],
)
def test_cluster_validation(fields, problem):
    with pytest.raises(TrainschedError) as info:
        make_cluster(**fields)
    assert problem in str(info.value)


def test_device_names_and_nodes():
    one = make_cluster()
    assert one.device_names() == ("gpu0", "gpu1", "gpu2", "gpu3")
    two = make_cluster(num_nodes=2, inter_node=NET)
    assert two.num_devices == 8
    assert two.device_names()[:5] == ("n0.gpu0", "n0.gpu1", "n0.gpu2", "n0.gpu3", "n1.gpu0")
    assert [two.node_of(i) for i in range(8)] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert two.device_index("n1.gpu2") == 6
    with pytest.raises(TrainschedError, match="has no device 'gpu9'"):
        two.device_index("gpu9")
    assert cluster_preset("cpu").device_names() == ("cpu0", "cpu1")


def test_link_intra_and_inter():
    two = make_cluster(num_nodes=2, inter_node=NET)
    assert two.link(0, 3) == LINK
    assert two.link(3, 4) == NET
    assert two.link(7, 0) == NET
    with pytest.raises(TrainschedError, match="no link from device 2 to itself"):
        two.link(2, 2)
    with pytest.raises(TrainschedError, match=r"device index 8 out of range 0\.\.7"):
        two.link(0, 8)
    with pytest.raises(TrainschedError, match="out of range"):
        two.node_of(-1)


def test_with_nodes():
    p3 = cluster_preset("p3.16xlarge")
    four = p3.with_nodes(4)
    assert (four.num_nodes, four.num_devices, four.name) == (4, 32, "p3.16xlarge")
    assert replace(four, num_nodes=1) == p3
    with pytest.raises(TrainschedError, match="inter-node link"):
        make_cluster().with_nodes(3)


def test_describe_mentions_the_facts():
    text = resolve_cluster("k80-ps").describe()
    for fact in ("k80-ps", "8 nodes", "K80-12GB", "12.0 GiB", "4.37 TFLOP/s fp32", "1.25 GB/s",
                 "8 parameter servers", "parallel"):
        assert fact in text
    text = cluster_preset("baechi-4x2080").describe()
    assert "sequential" in text and "134 µs" in text and "5.70 GB/s" in text


# --- presets ------------------------------------------------------------------------------

@pytest.mark.parametrize("name", list(PRESETS))
def test_preset_round_trips(name, tmp_path):
    cluster = cluster_preset(name)
    assert cluster.name == name
    assert cluster.inter_node is not None  # every preset can grow to several nodes
    assert Cluster.from_dict(cluster.to_dict()) == cluster
    text = cluster.to_json()
    assert Cluster.from_dict(json.loads(text)).to_json() == text
    (tmp_path / "c.json").write_text(text)
    assert load_cluster_file(tmp_path / "c.json") == cluster
    (tmp_path / "c.toml").write_text(cluster.to_toml())
    assert resolve_cluster(str(tmp_path / "c.toml")) == cluster
    big = cluster_preset(name, nodes=3)
    assert big.num_nodes == 3 and Cluster.from_dict(big.to_dict()) == big
    assert name in cluster.describe()


def test_preset_numbers():
    baechi = cluster_preset("baechi-4x2080")
    assert baechi.comm == "sequential" and baechi.num_devices == 4
    assert baechi.intra_node.bandwidth_bytes_per_s == 1 / 0.1754e-9
    assert baechi.intra_node.latency_s == 134e-6
    torch_fit = cluster_preset("baechi-4x2080-torch").intra_node
    assert torch_fit.bandwidth_bytes_per_s == 1 / 0.1788e-9
    assert torch_fit.latency_s == pytest.approx(120e-6)
    assert cluster_preset("p3.16xlarge").inter_node.bandwidth_bytes_per_s == 25e9 / 8
    assert cluster_preset("p3.16xlarge-10g").inter_node.bandwidth_bytes_per_s == 10e9 / 8
    assert cluster_preset("v100-rdma-100g").inter_node.bandwidth_bytes_per_s == 12.5e9
    assert cluster_preset("dgx-a100").intra_node.bandwidth_bytes_per_s == 300e9
    assert cluster_preset("dgx-h100").inter_node.bandwidth_bytes_per_s == 400e9
    k80 = cluster_preset("k80-ps")
    assert (k80.num_nodes, k80.devices_per_node, k80.parameter_servers) == (8, 1, 8)
    assert cluster_preset("k80-ps", nodes=16).parameter_servers == 16
    cpu = cluster_preset("cpu")
    assert cpu.device.kind == "cpu" and cpu.num_devices == 2


@pytest.mark.parametrize(
    ("alias", "name"),
    [("RTX2080x4", "baechi-4x2080"), ("BAECHI-4X2080", "baechi-4x2080"),
     ("P3.16xlarge", "p3.16xlarge"), ("sync-switch", "k80-ps"), ("dgx_h100", "dgx-h100")],
)
def test_preset_aliases(alias, name):
    assert resolve_cluster(alias).name == name


def test_unknown_preset_lists_known():
    with pytest.raises(TrainschedError, match=r"unknown cluster 'p4d'.*baechi-4x2080.*dgx-h100"):
        resolve_cluster("p4d")
    with pytest.raises(TrainschedError, match=r"unknown cluster preset 'p4d'.*p3.16xlarge"):
        cluster_preset("p4d")


def test_resolve_nodes_suffix():
    c = resolve_cluster("p3.16xlarge:4")
    assert (c.num_nodes, c.num_devices) == (4, 32)
    assert resolve_cluster("dgx-h100:16").num_devices == 128
    assert resolve_cluster("dgx-h100", nodes=2).num_nodes == 2
    assert resolve_cluster("baechi-4x2080:2").link(0, 4).bandwidth_bytes_per_s == 1.25e9
    assert resolve_cluster("dgx-h100:2", nodes=2).num_nodes == 2
    with pytest.raises(TrainschedError, match="asks for 2 nodes but nodes=3"):
        resolve_cluster("dgx-h100:2", nodes=3)
    with pytest.raises(TrainschedError, match="must be >= 1"):
        resolve_cluster("dgx-h100:0")
    with pytest.raises(TrainschedError, match="positive integer"):
        cluster_preset("cpu", nodes=0)


# --- files --------------------------------------------------------------------------------

def write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def test_documented_example(tmp_path):
    c = resolve_cluster(str(write(tmp_path, "lab.toml", EXAMPLE_TOML)))
    assert c.name == "lab" and c.comm == "sequential" and c.num_devices == 4
    assert c.device.kind == "RTX2080-8GB" and c.device.memory_bytes == 8 * 2**30
    assert dict(c.device.peak_flops_per_s) == {"fp32": 10e12}  # a single rate replaces the table
    assert c.device.launch_overhead_s == pytest.approx(5e-6)
    assert c.intra_node == Link(bandwidth_bytes_per_s=5.7e9, latency_s=134e-6)
    assert c.inter_node.bandwidth_bytes_per_s == 3.125e9
    assert c.parameter_servers == 1 and c.ps_link.bandwidth_bytes_per_s == 1.25e9
    assert resolve_cluster(f"{tmp_path / 'lab.toml'}:3").num_nodes == 3


def test_kind_only_device_and_dtype_table(tmp_path):
    text = """
name = "x"
[device]
kind = "a100"
count = 2
peak_flops = { fp32 = "19.5TFLOP/s", bf16 = "312 TFLOPS" }
[intra_node]
bandwidth = 300e9
latency = 1e-5
"""
    c = load_cluster_file(write(tmp_path, "x.toml", text))
    assert c.device.memory_bytes == 80 * 2**30 and c.device.launch_overhead_s == 5e-6
    assert dict(c.device.peak_flops_per_s) == {"fp32": 19.5e12, "bf16": 312e12}
    assert c.comm == "parallel" and c.num_nodes == 1


def test_custom_device_and_default_name(tmp_path):
    data = {"device": {"kind": "my-npu", "count": 2, "memory": "32GiB", "peak_flops": 1e14,
                       "memory_bandwidth": "1TB/s"},
            "intra_node": {"bandwidth": "50GB/s", "latency": "5us"}}
    c = load_cluster_file(write(tmp_path, "npu.json", json.dumps(data)))
    assert c.name == "npu" and c.device.kind == "my-npu" and c.device.launch_overhead_s == 0
    assert Cluster.from_dict(c.to_dict()) == c


LAB = "lab.toml"


@pytest.mark.parametrize(
    ("old", "new", "problem"),
    [('memory = "8GiB"', 'memory = "12XB"',
      "lab.toml: [device] memory: invalid size '12XB': unknown unit 'XB'"),
     ('memory_bandwidth = "448GB/s"', 'memroy_bandwidth = "448GB/s"',
      "lab.toml: [device]: unknown field 'memroy_bandwidth' (did you mean 'memory_bandwidth'?)"),
     ('comm = "sequential"', 'comm = "fast"', "lab.toml: comm: expected 'sequential' or"),
     ('nodes = 1', 'nodes = 0', "lab.toml: nodes: expected an integer >= 1, got 0"),
     ('nodes = 1', 'nodes = 1.5', "lab.toml: nodes: expected an integer >= 1"),
     ('format = "trainsched.cluster/1"', 'format = "trainsched.cluster/2"',
      "lab.toml: format: unsupported format 'trainsched.cluster/2'; this version reads "
      "'trainsched.cluster/1'"),
     ('nodes = 1', 'nodes = 1\ncolor = "red"', "lab.toml: unknown field 'color'"),
     ('latency = "134us"', 'latency = "134 parsecs"',
      "lab.toml: [intra_node] latency: invalid duration '134 parsecs'"),
     ('bandwidth = "5.7GB/s"', 'bandwidth = "0GB/s"',
      "lab.toml: [intra_node] bandwidth: invalid bandwidth '0GB/s': must be greater than 0"),
     ('peak_flops = "10TFLOP/s"', 'peak_flops = { fp32 = "1TFLOPS", fp8 = "2TFLOPS" }',
      "lab.toml: [device] peak_flops: unknown dtype(s) 'fp8'"),
     ('peak_flops = "10TFLOP/s"', 'peak_flops = { fp16 = "1TFLOPS" }',
      "lab.toml: [device] peak_flops: a table of rates must include fp32"),
     ('count = 4 ', 'count = "four" ', "lab.toml: [device] count: expected an integer >= 1"),
     ('count = 1\n', 'count = -1\n', "lab.toml: [parameter_servers] count: expected an integer"),
     ('kind = "RTX2080"', 'kind = "RTX9090"\n', ""),
     ('name = "lab"', 'name = 3', "lab.toml: name: expected a string, got 3"),
     ('[inter_node]', '[inter_nodes]', "lab.toml: unknown field 'inter_nodes' (did you mean "
      "'inter_node'?)")],
)
def test_file_errors_name_file_and_field(tmp_path, old, new, problem):
    assert old in EXAMPLE_TOML
    path = write(tmp_path, LAB, EXAMPLE_TOML.replace(old, new, 1))
    if not problem:  # an unknown kind with every number given is a custom device: valid
        load_cluster_file(path)
        return
    with pytest.raises(TrainschedError) as info:
        load_cluster_file(path)
    assert problem in str(info.value)


@pytest.mark.parametrize(
    ("drop", "problem"),
    [("[device]", "lab.toml: missing required table [device]"),
     ("[intra_node]", "lab.toml: missing required table [intra_node]"),
     ("count = 4", "lab.toml: [device]: missing required field 'count'"),
     ('latency = "134us"', "lab.toml: [intra_node]: missing required field 'latency'")],
)
def test_file_missing_fields(tmp_path, drop, problem):
    text = EXAMPLE_TOML
    if drop.startswith("["):  # drop the whole table
        start = text.index(drop)
        end = text.index("[", start + 1)
        text = text[:start] + text[end:]
    else:
        text = text.replace(drop, "", 1)
    with pytest.raises(TrainschedError) as info:
        load_cluster_file(write(tmp_path, LAB, text))
    assert problem in str(info.value)


def test_multi_node_file_needs_inter_node(tmp_path):
    start = EXAMPLE_TOML.index("[inter_node]")
    end = EXAMPLE_TOML.index("[parameter_servers]")
    text = (EXAMPLE_TOML[:start] + EXAMPLE_TOML[end:]).replace("nodes = 1", "nodes = 2")
    with pytest.raises(TrainschedError, match=r"lab.toml: cluster 'lab': 2 nodes need an "
                                               r"inter-node link"):
        load_cluster_file(write(tmp_path, LAB, text))


def test_unknown_kind_without_numbers(tmp_path):
    text = EXAMPLE_TOML.replace('kind = "RTX2080"', 'kind = "RTX9090"').replace(
        'memory_bandwidth = "448GB/s"', "")
    with pytest.raises(TrainschedError, match=r"lab.toml: \[device\]: unknown device kind "
                                               r"'RTX9090' \(known: RTX2080-8GB.*memory_bandwidth"):
        load_cluster_file(write(tmp_path, LAB, text))
    text = EXAMPLE_TOML.replace('kind = "RTX2080"', "").replace('memory = "8GiB"', "")
    with pytest.raises(TrainschedError, match=r"\[device\]: missing memory; give them or"):
        load_cluster_file(write(tmp_path, LAB, text))


@pytest.mark.parametrize(
    ("name", "text", "problem"),
    [("bad.toml", 'name = "x"\n[device\ncount = 4', "bad.toml: invalid TOML"),
     ("bad.toml", 'name = "x', "bad.toml: invalid TOML"),
     ("bad.json", '{"name": "x", "device": {', "bad.json: invalid JSON"),
     ("bad.json", "[1, 2]", "bad.json: expected a table/object at the top level"),
     ("bad.json", '{"device": 4, "intra_node": {}}', "bad.json: [device]: expected a table"),
     ("bad.yaml", "name: x", "expected a .toml or .json file")],
)
def test_malformed_files(tmp_path, name, text, problem):
    with pytest.raises(TrainschedError) as info:
        resolve_cluster(str(write(tmp_path, name, text))) if name.endswith(
            ("toml", "json")) else load_cluster_file(write(tmp_path, name, text))
    assert problem in str(info.value)


def test_missing_file(tmp_path):
    with pytest.raises(TrainschedError, match=r"cluster file '.*nope.toml' not found"):
        resolve_cluster(str(tmp_path / "nope.toml"))


def test_from_dict_names_source():
    data = cluster_preset("cpu").to_dict()
    data["device"]["memory"] = "lots"
    with pytest.raises(TrainschedError, match=r"^<dict>: \[device\] memory: invalid size 'lots'"):
        Cluster.from_dict(data)
    with pytest.raises(TrainschedError, match=r"^flags.json: \[device\] memory"):
        Cluster.from_dict(data, source="flags.json")


def test_to_json_is_stable():
    text = cluster_preset("dgx-a100").to_json()
    assert text == cluster_preset("dgx-a100").to_json()
    data = json.loads(text)
    assert data["format"] == FORMAT and list(data) == sorted(data)


# --- flags --------------------------------------------------------------------------------

def test_flags_basic():
    c = cluster_from_flags(devices=4, memory="8GiB", bandwidth="5.7GB/s", latency="134us",
                           peak_flops="10TFLOP/s", memory_bandwidth="448GB/s", comm="sequential")
    assert c.num_devices == 4 and c.name == "custom" and c.comm == "sequential"
    assert c.device.memory_bytes == 8 * 2**30 and c.device.peak_flops() == 10e12
    assert c.intra_node == Link(bandwidth_bytes_per_s=5.7e9, latency_s=134e-6)
    custom = cluster_from_flags(devices=1, memory="1GiB", bandwidth="1GB/s", latency="1us",
                                device_kind="TPU", peak_flops="1TFLOPS", memory_bandwidth="1TB/s")
    assert custom.device.kind == "TPU" and custom.device_names() == ("gpu0",)


def test_numbers_are_stored_as_floats():
    link = Link(bandwidth_bytes_per_s=100, latency_s=0)
    assert isinstance(link.bandwidth_bytes_per_s, float) and isinstance(link.latency_s, float)
    cluster = make_cluster(intra_node=link)
    assert Cluster.from_dict(json.loads(cluster.to_json())).to_json() == cluster.to_json()


def test_flags_with_device_kind_defaults():
    c = cluster_from_flags(devices="8", memory=None, bandwidth="150GB/s", latency="10us",
                           device_kind="v100", nodes="2", inter_bandwidth="25Gbit/s",
                           inter_latency="50us", name="mine")
    assert c.device == device_kind("V100") and c.num_devices == 16 and c.name == "mine"
    assert c.link(0, 8).bandwidth_bytes_per_s == 3.125e9
    c = cluster_from_flags(devices=2, memory="32GiB", bandwidth="1GB/s", latency="1ms",
                           device_kind="h100", peak_flops="fp32=60TFLOP/s,bf16=900TFLOP/s")
    assert c.device.memory_bytes == 32 * 2**30 and c.device.peak_flops("bf16") == 900e12


@pytest.mark.parametrize(
    ("overrides", "problem"),
    [({"memory": "12XB"}, "--memory: invalid size '12XB'"),
     ({"bandwidth": "fast"}, "--bandwidth: invalid bandwidth 'fast'"),
     ({"latency": "-1us"}, "--latency: invalid duration '-1us': must not be negative"),
     ({"devices": 0}, "--devices: expected an integer >= 1, got 0"),
     ({"devices": "four"}, "--devices: expected an integer >= 1"),
     ({"comm": "both"}, "--comm: expected 'sequential' or 'parallel', got 'both'"),
     ({"nodes": 2}, "--nodes 2 needs --inter-bandwidth and --inter-latency"),
     ({"inter_bandwidth": "25Gbit/s"}, "give both or neither"),
     ({"peak_flops": "fp32=1TFLOPS,fp16"}, "--peak-flops: expected one rate or DTYPE=RATE"),
     ({"device_kind": "TPU", "peak_flops": None}, "--device-kind: unknown device kind 'TPU'"),
     ({"nodes": 2, "inter_bandwidth": "1GB/s", "inter_latency": "1 h"},
      "--inter-latency: invalid duration '1 h'")],
)
def test_flag_errors_name_the_flag(overrides, problem):
    flags = dict(devices=4, memory="8GiB", bandwidth="5.7GB/s", latency="134us",
                 peak_flops="10TFLOP/s", memory_bandwidth="448GB/s")
    with pytest.raises(TrainschedError) as info:
        cluster_from_flags(**{**flags, **overrides})
    assert problem in str(info.value)


def test_flags_without_speed_figures_take_the_default_kind_and_say_so():
    c = cluster_from_flags(devices=4, memory="8GiB", bandwidth="5.7GB/s", latency="134us")
    v100 = device_kind("V100")
    assert c.device.kind == "custom (V100-16GB speed)"
    assert c.device.memory_bytes == 8 * 2**30
    assert c.device.peak_flops("fp32") == v100.peak_flops("fp32")
    assert c.intra_node.latency_s == pytest.approx(134e-6)


def test_comm_compute_share_round_trips_and_is_checked(tmp_path):
    base = cluster_preset("cpu")
    cluster = replace(base, device=replace(base.device, comm_compute_share=0.8))
    assert Cluster.from_dict(cluster.to_dict()) == cluster
    assert "0.80 s of compute per s" in cluster.describe()
    assert "comm_compute_share" not in base.to_dict()["device"]  # 0: the format stays as it was
    with pytest.raises(TrainschedError, match="comm_compute_share must be a number in"):
        replace(base.device, comm_compute_share=-0.5)
    path = tmp_path / "c.toml"
    path.write_text('name = "x"\n[device]\nkind = "cpu"\ncount = 2\ncomm_compute_share = "a lot"\n'
                    '[intra_node]\nbandwidth = "1GB/s"\nlatency = "1ms"\n')
    with pytest.raises(TrainschedError, match="comm_compute_share"):
        load_cluster_file(path)


@pytest.mark.parametrize(("call", "message"), [
    (lambda: resolve_cluster(123), "resolve_cluster takes a preset name, 'NAME:N' or a cluster "
                                   "file path \\(a str\\), got int 123"),
    (lambda: resolve_cluster("p3.16xlarge", nodes="2"), "nodes must be a positive integer"),
    (lambda: resolve_cluster("p3.16xlarge:0"), "the number of nodes must be >= 1"),
])
def test_resolve_cluster_refuses_wrong_types(call, message):
    with pytest.raises(TrainschedError, match=message):
        call()


def test_the_label_keeps_the_node_count_the_name_drops():
    four = resolve_cluster("p3.16xlarge:4")
    assert (four.name, four.label, four.num_devices) == ("p3.16xlarge", "p3.16xlarge:4", 32)
    assert resolve_cluster(four.label) == four  # the label resolves back to the cluster
    assert resolve_cluster("p3").label == "p3.16xlarge"  # one node: the name alone


def test_buffer_sync_round_trips_and_is_checked(tmp_path):
    base = cluster_preset("cpu")
    cluster = replace(base, device=replace(base.device, buffer_sync_s=1.5e-3))
    assert Cluster.from_dict(cluster.to_dict()) == cluster
    assert "broadcasts the buffers before each forward: 1.50 ms" in cluster.describe()
    assert "buffer_sync" not in base.to_dict()["device"]  # 0: the format stays as it was
    with pytest.raises(TrainschedError, match="buffer_sync_s must be a duration >= 0 s"):
        replace(base.device, buffer_sync_s=-1e-3)
    path = tmp_path / "c.toml"
    path.write_text('name = "x"\n[device]\nkind = "cpu"\ncount = 2\nbuffer_sync = "2ms"\n'
                    '[intra_node]\nbandwidth = "1GB/s"\nlatency = "1ms"\n')
    assert load_cluster_file(path).device.buffer_sync_s == pytest.approx(2e-3)


def test_collective_after_compute_round_trips_and_is_checked(tmp_path):
    base = cluster_preset("cpu")
    cluster = replace(base, device=replace(base.device, collective_after_compute_s=2e-3))
    assert Cluster.from_dict(cluster.to_dict()) == cluster
    assert "first collective of each step takes 2.00 ms longer" in cluster.describe()
    assert "collective_after_compute" not in base.to_dict()["device"]
    path = tmp_path / "c.toml"
    path.write_text('name = "x"\n[device]\nkind = "cpu"\ncount = 2\n'
                    'collective_after_compute = "1.5ms"\n'
                    '[intra_node]\nbandwidth = "1GB/s"\nlatency = "1ms"\n')
    assert load_cluster_file(path).device.collective_after_compute_s == pytest.approx(1.5e-3)
