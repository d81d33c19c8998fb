"""Plans as data: the four kinds, the trainsched.plan/1 file, validation, sim.simulate."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest

from trainsched.backprop.schedules import gpipe, one_f_one_b
from trainsched.backprop.stages import stage_costs_from_graph
from trainsched.cluster import resolve_cluster
from trainsched.comm.policy import ByteSchedulerPolicy, DdpBucketPolicy, PriorityPolicy
from trainsched.errors import TrainschedError
from trainsched.graph import Edge, Graph, Op, to_training
from trainsched.plan import (
    PLAN_FORMAT,
    DataParallelPlan,
    ModelRef,
    PipelinePlan,
    PlacedPlan,
    Placement,
    SinglePlan,
    load_plan,
    plan_from_json,
    plan_to_json,
    save_plan,
)
from trainsched.sim import (
    simulate,
    simulate_data_parallel,
    simulate_pipeline,
    simulate_placed,
    simulate_single,
)

MiB = 1 << 20


def chain(n: int = 6, model: str = "chain") -> Graph:
    ops = [Op(name=f"l{i}", compute_s=1e-3 * (i + 1), flops=1e9, param_bytes=4_000_000,
              output_bytes=1_000_000, saved_bytes=1_000_000) for i in range(n)]
    edges = [Edge(src=f"l{i}", dst=f"l{i + 1}", size_bytes=1_000_000) for i in range(n - 1)]
    return to_training(Graph(ops, edges, {"model": model, "batch_size": 16}))


def every_kind(graph: Graph) -> list:
    model = ModelRef.of(graph)
    placement = Placement(device_of={op.name: int(op.name[1]) % 2 if op.name[0] == "l" else 0
                                     for op in graph.ops}, num_devices=2, meta={"policy": "x"})
    return [
        SinglePlan(model=model),
        PlacedPlan(model=model, placement=placement),
        DataParallelPlan(model=model, ranks=4, comm="bytescheduler",
                         policy=ByteSchedulerPolicy(partition_bytes=2 * MiB,
                                                    credit_bytes=math.inf),
                         steps=3, order="static", startup_overlap=True),
        DataParallelPlan(model=model, ranks=2, comm="tictac",
                         policy=PriorityPolicy(cross_barrier=True), algorithm="tree",
                         sync="bsp:0.25,ssp(s=2):0.75;straggler(relax)", servers=2,
                         server_placement="colocated"),
        PipelinePlan(model=model, stages=(("l0", "l1"), ("l2", "l3"), ("l4", "l5")),
                     schedule=one_f_one_b(3, 4), schedule_name="1f1b"),
    ]


def test_model_ref_fingerprints_the_forward_ops_only():
    graph = chain()
    forward = Graph([op for op in graph.ops if op.kind == "forward"],
                    [e for e in graph.edges if graph.op(e.src).kind == "forward"
                     and graph.op(e.dst).kind == "forward"], graph.meta)
    assert ModelRef.of(graph) == ModelRef.of(forward)
    ref = ModelRef.of(graph)
    assert (ref.name, ref.forward_ops, ref.batch_size, ref.image_size) == ("chain", 6, 16, None)
    assert ModelRef.of(chain(7)).fingerprint != ref.fingerprint


@pytest.mark.parametrize("index", range(5))
def test_every_kind_round_trips_exactly_through_the_file(index, tmp_path):
    plan = every_kind(chain())[index]
    text = plan_to_json(plan)
    assert plan_from_json(text) == plan
    assert plan_to_json(plan_from_json(text)) == text  # byte-identical
    path = tmp_path / "p.plan.json"
    save_plan(plan, path)
    assert load_plan(path) == plan
    doc = json.loads(text)
    assert doc["format"] == PLAN_FORMAT and doc["strategy"]["kind"] == plan.kind


def test_a_plans_sync_policy_is_kept_in_its_canonical_text():
    model = ModelRef.of(chain())
    plan = DataParallelPlan(model=model, ranks=4, comm="ddp", policy=DdpBucketPolicy(),
                            sync=" bsp : 0.125 , asp:0.875 ")
    assert plan.sync == "bsp:0.125,asp:0.875"
    assert plan.sync_policy.bsp_fraction == 0.125
    assert DataParallelPlan(model=model, ranks=4, comm="ddp", policy=DdpBucketPolicy(),
                            sync="asp:1").sync == "asp"


def _data(sync: str = "asp", **servers) -> DataParallelPlan:
    return DataParallelPlan(model=ModelRef.of(chain()), ranks=4, comm="ddp",
                            policy=DdpBucketPolicy(), sync=sync, **servers)


def test_a_plans_servers_default_to_one_dedicated():
    plan = _data()
    assert (plan.servers, plan.server_placement) == (1, "dedicated")


def test_a_plans_servers_are_written_to_the_file_and_read_back():
    plan = _data("k-of-n:3", servers=3, server_placement="colocated")
    doc = json.loads(plan_to_json(plan))["strategy"]
    assert (doc["servers"], doc["server_placement"]) == (3, "colocated")
    assert plan_from_json(plan_to_json(plan)) == plan


def test_a_plan_file_without_the_servers_loads_with_the_defaults():
    doc = json.loads(plan_to_json(_data("ssp:2", servers=2)))
    del doc["strategy"]["servers"], doc["strategy"]["server_placement"]
    plan = plan_from_json(json.dumps(doc))
    assert (plan.sync, plan.servers, plan.server_placement) == ("ssp:2", 1, "dedicated")


def test_a_policy_without_servers_writes_no_server_fields():
    assert "servers" not in json.loads(plan_to_json(_data("bsp:0.5,local(h=4):0.5")))["strategy"]


@pytest.mark.parametrize(("sync", "servers", "words"), [
    ("bsp", {"servers": 2}, "apply to a sync policy with a parameter-server phase"),
    ("local:4", {"server_placement": "colocated"}, "'local:4' has none"),
    ("asp", {"servers": 0}, "servers must be an integer >= 1"),
    ("asp", {"server_placement": "rack"}, "must be one of dedicated, colocated, got 'rack'"),
    ("asp", {"servers": 5, "server_placement": "colocated"}, "give at most 4 servers"),
])
def test_bad_server_fields_are_refused(sync, servers, words):
    with pytest.raises(TrainschedError, match=words.replace("(", r"\(").replace(")", r"\)")):
        _data(sync, **servers)


def test_a_relaxing_straggler_policy_has_servers():
    assert _data("bsp;straggler(relax)", servers=2).servers == 2


def test_a_bad_server_field_in_a_file_names_the_field():
    doc = json.loads(plan_to_json(_data("asp")))
    doc["strategy"]["servers"] = "two"
    with pytest.raises(TrainschedError, match=r"strategy\.servers: expected an integer"):
        plan_from_json(json.dumps(doc))


def test_a_plans_k_of_n_may_not_wait_for_more_ranks_than_it_has():
    with pytest.raises(TrainschedError, match="k=5 is more than the 4 ranks"):
        DataParallelPlan(model=ModelRef.of(chain()), ranks=4, comm="ddp",
                         policy=DdpBucketPolicy(), sync="k-of-n(k=5)")


def test_an_unlimited_credit_is_written_as_inf():
    plan = every_kind(chain())[2]
    doc = json.loads(plan_to_json(plan))
    assert doc["strategy"]["comm"]["fields"]["credit_bytes"] == "inf"
    assert doc["strategy"]["comm"]["class"] == "ByteSchedulerPolicy"


def test_validation_refuses_a_plan_for_another_model():
    plan = SinglePlan(model=ModelRef.of(chain(6)))
    with pytest.raises(TrainschedError, match=r"made for model 'chain' .6 forward ops.*but the "
                                              "graph is 'other' .7 forward ops"):
        plan.validate(chain(7, model="other"))


def test_validation_refuses_more_ranks_than_devices():
    plan = DataParallelPlan(model=ModelRef.of(chain()), ranks=16, comm="ddp",
                            policy=DdpBucketPolicy())
    with pytest.raises(TrainschedError, match=r"16 ranks but cluster 'p3.16xlarge' has 8"):
        plan.validate(chain(), resolve_cluster("p3.16xlarge"))


def test_a_schedule_for_another_stage_count_is_refused():
    with pytest.raises(TrainschedError, match="schedule is for 3 stages but the plan cuts the "
                                              "model into 2"):
        PipelinePlan(model=ModelRef.of(chain()), stages=(("l0", "l1", "l2"), ("l3", "l4", "l5")),
                     schedule=gpipe(3, 2))


@pytest.mark.parametrize(("stages", "message"), [
    ((("l0", "l1", "l2"), ("l3", "l4", "l9")), "stage op 'l9' is not a forward op"),
    ((("l0", "l1", "l2"), ("l3", "l4")), "forward op 'l5' is in no stage"),
    ((("l0", "l3", "l2"), ("l1", "l4", "l5")), "do not list the forward ops once each"),
])
def test_pipeline_stages_must_cut_the_forward_ops_in_order(stages, message):
    plan = PipelinePlan(model=ModelRef.of(chain()), stages=stages, schedule=gpipe(2, 2))
    with pytest.raises(TrainschedError, match=message):
        plan.validate(chain())


def test_pipeline_cuts_are_each_stages_first_op():
    plan = every_kind(chain())[4]
    assert plan.cuts == ("l2", "l4")


def test_a_placement_for_other_ops_is_refused():
    plan = PlacedPlan(model=ModelRef.of(chain()),
                      placement=Placement(device_of={"l0": 0}, num_devices=1))
    with pytest.raises(TrainschedError, match="without a device"):
        plan.validate(chain())


@pytest.mark.parametrize(("edit", "message"), [
    (lambda d: d.update(format="trainsched.plan/9"), "format 'trainsched.plan/9'"),
    (lambda d: d["strategy"].update(kind="composed"), "composed plans .* not supported yet"),
    (lambda d: d["strategy"].update(kind="teleport"), "unknown plan kind 'teleport'"),
    (lambda d: d["strategy"].update(ranks="4"), "strategy.ranks: expected an integer"),
    (lambda d: d["strategy"].update(ranks=True), "strategy.ranks: expected an integer"),
    (lambda d: d["strategy"]["comm"].update(name="horovod"), "unknown comm policy 'horovod'"),
    (lambda d: d["strategy"]["comm"].update({"class": "FifoPolicy"}),
     "registered as 'bytescheduler' is a ByteSchedulerPolicy, not a FifoPolicy"),
    (lambda d: d["strategy"]["comm"]["fields"].update(partition_bytes=-1), "partition_bytes"),
    (lambda d: d["strategy"].update(sync="bsp:0.5,hogwild:0.5"),
     "column 9 .*unknown sync protocol 'hogwild'"),
    (lambda d: d["strategy"].update(sync="bsp:0.5,asp:0.4"), "sum to 0.9, not 1"),
    (lambda d: d["strategy"].update(colour="blue"), "strategy.colour: unknown field"),
    (lambda d: d["model"].pop("fingerprint"), "missing field model.fingerprint"),
])
def test_a_bad_plan_file_names_the_field(edit, message):
    doc = json.loads(plan_to_json(every_kind(chain())[2]))
    edit(doc)
    with pytest.raises(TrainschedError, match=f"^plan.json: .*{message}"):
        plan_from_json(json.dumps(doc), source="plan.json")


def test_truncated_and_non_object_files_are_user_errors():
    text = plan_to_json(SinglePlan(model=ModelRef.of(chain())))
    with pytest.raises(TrainschedError, match="truncated"):
        plan_from_json(text.rstrip()[:-1], source="p.json")
    with pytest.raises(TrainschedError, match="expected a JSON object"):
        plan_from_json("[1, 2]", source="p.json")


def test_simulate_runs_each_kind_on_its_executor():
    graph, cluster = chain(), resolve_cluster("p3.16xlarge")
    # the data plan overlaps start-ups: a FIFO-wire rule, so compute at full speed beside it
    cluster = dataclasses.replace(cluster, device=dataclasses.replace(
        cluster.device, compute_rate_with_comm=1.0))
    single, placed, data, _, pipe = every_kind(graph)
    assert simulate(single, graph, cluster).step_time_s == \
        simulate_single(graph, cluster).step_time_s
    assert simulate(placed, graph, cluster).step_time_s == simulate_placed(
        graph, cluster.first_devices(2), placed.placement).step_time_s
    assert simulate(data, graph, cluster).step_time_s == simulate_data_parallel(
        graph, cluster, ranks=4, policy=data.policy, steps=3,
        startup_overlap=True).step_time_s
    stages = stage_costs_from_graph(graph, 3, 4, cut=["l2", "l4"])
    assert simulate(pipe, graph, cluster).step_time_s == \
        simulate_pipeline(stages, pipe.schedule, cluster).step_time_s


def test_simulate_gives_a_forward_graph_its_training_ops():
    graph = chain()
    forward = Graph([op for op in graph.ops if op.kind == "forward"],
                    [e for e in graph.edges if graph.op(e.src).kind == "forward"
                     and graph.op(e.dst).kind == "forward"], graph.meta)
    plan = SinglePlan(model=ModelRef.of(graph))
    cluster = resolve_cluster("p3.16xlarge")
    assert simulate(plan, forward, cluster).step_time_s == \
        simulate(plan, graph, cluster).step_time_s


def test_simulate_refuses_wrong_types_with_a_clear_error():
    plan = SinglePlan(model=ModelRef.of(chain()))
    with pytest.raises(TrainschedError, match="needs a Cluster"):
        simulate(plan, chain(), "p3.16xlarge")
    with pytest.raises(TrainschedError, match="not a plan"):
        simulate("single", chain(), resolve_cluster("p3.16xlarge"))


@pytest.mark.parametrize(("tier", "device", "fits", "refused"), [
    ("measured", "cpu", "cpu", "p3.16xlarge"),
    ("roofline", "V100-16GB", "p3.16xlarge", "dgx-h100"),
    ("measured", "NVIDIA H100 80GB HBM3", "dgx-h100", "p3.16xlarge"),
    ("measured", "NVIDIA H100 80GB HBM3", "dgx-h100", "cpu"),
])
def test_costs_replay_only_on_the_device_they_belong_to(tier, device, fits, refused):
    graph = chain().with_meta({**chain().meta, "tier": tier, "device": device})
    plan = SinglePlan(model=ModelRef.of(graph))
    assert simulate(plan, graph, resolve_cluster(fits)).step_time_s == \
        simulate_single(graph, resolve_cluster(fits)).step_time_s
    kind = resolve_cluster(refused).device.kind
    with pytest.raises(TrainschedError, match=f"costs are {tier} on {device}, but cluster "
                                              f"{refused} has {kind} devices"):
        simulate(plan, graph, resolve_cluster(refused))


def test_a_graph_that_says_nothing_of_its_costs_simulates_anywhere():
    graph = chain()  # built by hand: no tier, no device
    for name in ("cpu", "p3.16xlarge", "dgx-h100"):
        assert simulate(SinglePlan(model=ModelRef.of(graph)), graph,
                        resolve_cluster(name)).step_time_s > 0


def test_a_placed_plan_keeps_its_order_through_the_file_and_simulate_replays_it():
    graph = chain()
    model = ModelRef.of(graph)
    device_of = {op.name: int(op.name[1]) % 2 if op.name[0] == "l" else 0 for op in graph.ops}
    order = graph.topological_order()
    ordered = PlacedPlan(model=model, placement=Placement(device_of=device_of, num_devices=2,
                                                          order=order))
    back = plan_from_json(plan_to_json(ordered))
    assert back == ordered and back.placement.order == order
    cluster = resolve_cluster("p3.16xlarge")
    # Every weight gradient after every input gradient: a valid order, and a slower step.
    late = [n for n in order if not n.endswith((":dW", ":opt"))] + \
        [n for n in order if n.endswith(":dW")] + [n for n in order if n.endswith(":opt")]
    moved = PlacedPlan(model=model, placement=Placement(device_of=device_of, num_devices=2,
                                                        order=late))
    step = simulate(moved, graph, cluster).step_time_s
    assert step == simulate_placed(graph, cluster.first_devices(2), device_of,
                                   order=late).step_time_s
    assert step > simulate(ordered, graph, cluster).step_time_s
    assert json.loads(plan_to_json(every_kind(graph)[1]))["strategy"].get("order") is None


@pytest.mark.parametrize("index", range(4))
def test_a_micro_batch_graph_is_refused_for_a_plan_without_micro_batches(index):
    graph = chain()
    plan = every_kind(graph)[index]
    with pytest.raises(TrainschedError, match=f"this is a {plan.kind} plan"):
        simulate(plan, graph, resolve_cluster("p3.16xlarge"), microbatch_graph=graph)
