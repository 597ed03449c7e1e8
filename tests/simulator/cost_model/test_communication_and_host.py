"""Communication (collectives over the GPUs' link) and host time as parts of step time.

Each expected number is computed here by hand from the cited constants
(``simulator/cost_model/interconnect.py``, ``host_time.py``), so a wrong formula or a changed
constant fails."""

from __future__ import annotations

import pytest
import yaml

from kvsim.simulator.config import ConfigError, validate_config
from kvsim.simulator.cost_model.base import BatchShape, Deployment, causal_attention_pairs
from kvsim.simulator.cost_model.calibrated import CalibratedCostModel, load_profile_for
from kvsim.simulator.cost_model.catalogue import GPUS, MODELS
from kvsim.simulator.cost_model.host_time import HOST_PRESETS, HostTime
from kvsim.simulator.cost_model.interconnect import (
    all_to_all_s,
    interconnect,
    link_all_reduce_s,
    link_all_to_all_s,
    link_send_recv_s,
    ring_all_reduce_s,
    send_recv_s,
)
from kvsim.simulator.cost_model.profiled import ProfiledCostModel, load_profile
from kvsim.simulator.cost_model.roofline import RooflineCostModel
from kvsim.simulator.engine.runner import make_cost_factory, run_experiment

GB = 1e9
SHAPES = [
    BatchShape(decode_seqs=48, decode_context=48 * 900),
    BatchShape(prefill_seqs=1, prefill_tokens=512, prefill_attn_pairs=causal_attention_pairs(512)),
    BatchShape(prefill_seqs=2, prefill_tokens=300, prefill_attn_pairs=causal_attention_pairs(150, 64) * 2,
               decode_seqs=20, decode_context=20 * 3000),
]


@pytest.fixture(scope="module")
def operator_profile():
    return load_profile("rtx4090-llama-3.1-8b")


# --- collectives ---------------------------------------------------------------------------
def test_collectives_by_hand():
    assert ring_all_reduce_s(1e6, 2, 40.1 * GB, 24e-6) == pytest.approx(1e6 / 40.1e9 + 24e-6, rel=1e-15)
    assert ring_all_reduce_s(1e6, 8, 480 * GB, 6e-6) == pytest.approx(1.75 * 1e6 / 480e9 + 6e-6, rel=1e-15)
    assert all_to_all_s(8e6, 4, 35 * GB, 24e-6) == pytest.approx(0.75 * 8e6 / 35e9 + 24e-6, rel=1e-15)
    assert send_recv_s(2e6, 116 * GB, 6e-6) == pytest.approx(2e6 / 116e9 + 6e-6, rel=1e-15)
    for f in (ring_all_reduce_s, all_to_all_s):  # one GPU talks to nobody
        assert f(1e9, 1, 1.0, 1.0) == 0.0


def test_catalogue_links_are_the_cited_nccl_figures():
    """busbw at the nearest measured rank count; never the datasheet's line rate."""
    bw = {name: {n: interconnect(name).all_reduce.bandwidth(n) for n in (2, 4, 8)}
          for name in ("nvlink3", "nvlink4", "nvlink5", "pcie-gen5-p2p", "pcie-gen5", "pcie-gen4-p2p", "pcie-gen4")}
    assert bw["nvlink3"] == {2: 230 * GB, 4: 230 * GB, 8: 230 * GB}  # nccl-tests #149/#175
    assert bw["nvlink4"] == {2: 370 * GB, 4: 370 * GB, 8: 480 * GB}  # nccl-tests #212 (ring; NVLS at 8)
    assert bw["nvlink5"][8] == 830 * GB  # nccl #1807
    assert bw["pcie-gen5-p2p"][2] == 40.1 * GB  # rtx6kpro, 8 GPUs (the one count measured)
    assert bw["pcie-gen5"] == {2: 35 * GB, 4: 35 * GB, 8: 28 * GB}  # nccl #1639
    assert bw["pcie-gen4-p2p"][2] == 25.8 * GB  # tinygrad open-gpu-kernel-modules #36
    assert bw["pcie-gen4"][4] == pytest.approx(35 * GB * 25.8 / 40.1)  # derived (no published figure)
    assert interconnect("nvlink4").all_reduce.latency_s == 6e-6 and interconnect("pcie-gen4").all_reduce.latency_s == 24e-6
    assert interconnect("pcie-gen4-x8-p2p").all_reduce.bandwidth(2) == pytest.approx(25.8 * GB / 2)
    assert interconnect("none") is None
    for g in ("a100-80gb", "h100-sxm", "rtx4090"):  # below the link's datasheet rate
        link = interconnect(GPUS[g].interconnect)
        assert link.all_reduce.bandwidth(2) < (GPUS[g].nvlink_bandwidth or 32e9)
    # all-to-all and send/recv over a catalogue link use its all-reduce numbers
    link = interconnect("pcie-gen5")
    assert link_all_to_all_s(link, 4e6, 4) == pytest.approx(0.75 * 4e6 / 35e9 + 24e-6)
    assert link_send_recv_s(link, 4e6) == pytest.approx(4e6 / 35e9 + 24e-6)
    assert link_all_reduce_s(link, 4e6, 8) == pytest.approx(1.75 * 4e6 / 28e9 + 24e-6)


def test_unknown_links_name_what_is_allowed():
    with pytest.raises(ValueError, match="unknown interconnect 'nvlink9'.*nvlink4.*pcie-gen4"):
        interconnect("nvlink9")


# --- tensor-parallel communication in each cost model ----------------------------------------
def test_roofline_tp_all_reduce_by_hand():
    """Qwen3-32B on 2 RTX PRO 6000 (PCIe 5.0, P2P): 64 layers x 2 all-reduces of tokens x 5120 x 2 B."""
    m = MODELS["qwen3-32b"]
    cost = RooflineCostModel(m, GPUS["rtx-pro-6000"], 2)
    shape = BatchShape(decode_seqs=100, decode_context=100 * 2000)
    by_hand = 2 * 64 * (24e-6 + (2 * 1 / 2) * 100 * 5120 * 2 / 40.1e9)
    parts = cost.step_parts(shape)
    assert parts.communication_s == pytest.approx(by_hand, rel=1e-12)
    assert parts.total_s == pytest.approx(cost.step_time(shape), rel=1e-12)
    a, _ = cost.decode_coefficients(100)  # the closed-form decode runs pay it too
    assert a - RooflineCostModel(m, GPUS["rtx-pro-6000"], 2, interconnect="nvlink5").decode_coefficients(100)[0] \
        == pytest.approx(by_hand - 2 * 64 * (6e-6 + 100 * 5120 * 2 / 830e9), rel=1e-9)
    # an explicit link: the given numbers at every rank count
    from kvsim.simulator.cost_model.interconnect import explicit_link
    slow = RooflineCostModel(m, GPUS["rtx-pro-6000"], 4, interconnect=explicit_link(10, 1e-4))
    assert slow.step_parts(shape).communication_s == pytest.approx(2 * 64 * (1e-4 + 1.5 * 100 * 5120 * 2 / 10e9))


def test_one_gpu_has_no_communication(operator_profile):
    calibrated = load_profile_for("example-a100-80gb")
    models = [RooflineCostModel(MODELS["llama-3.1-8b"], GPUS["rtx4090"]),
              ProfiledCostModel(operator_profile, Deployment(MODELS["llama-3.1-8b"], GPUS["rtx4090"])),
              CalibratedCostModel(calibrated, Deployment(MODELS["llama-3-8b"], GPUS["a100-80gb"]))]
    for cost in models:
        assert cost.communication_coefficients() == (0.0, 0.0)
        for shape in SHAPES:
            parts = cost.step_parts(shape)
            assert parts.communication_s == 0.0 and parts.host_s == 0.0
            assert parts.compute_s == cost.step_time(shape)  # exactly: nothing added on one GPU


@pytest.mark.parametrize("kind", ["roofline", "calibrated", "profiled"])
def test_parts_add_up_to_the_step_time(operator_profile, kind):
    host = HOST_PRESETS["vllm-2023-a100"]
    if kind == "profiled":
        cost = ProfiledCostModel(operator_profile, Deployment(MODELS["llama-3.1-8b"], GPUS["rtx4090"], 2, host=host))
    elif kind == "calibrated":
        d = Deployment(MODELS["llama-3-8b"], GPUS["a100-80gb"], 4, interconnect="nvlink3", host=host)
        cost = CalibratedCostModel(load_profile_for("example-a100-80gb"), d)
    else:
        cost = RooflineCostModel(MODELS["opt-66b"], GPUS["a100-40gb"], 4, host=host)
    fixed, per_token = cost.communication_coefficients()
    assert fixed > 0 and per_token > 0
    for shape in SHAPES:
        parts = cost.step_parts(shape)
        assert parts.communication_s == pytest.approx(fixed + per_token * shape.num_tokens, rel=1e-12)
        assert parts.compute_s > 0 and parts.communication_s > 0 and parts.host_s > 0
        assert parts.total_s == pytest.approx(cost.step_time(shape), rel=1e-12)


def test_profiled_adds_the_all_reduces_its_tables_lack(operator_profile):
    """tp1 tables / 2 plus the link's all-reduces: RTX 4090 (PCIe 4.0, no P2P) vs an NVLink 4 pair."""
    d = Deployment(MODELS["llama-3.1-8b"], GPUS["rtx4090"], 2)
    pcie = ProfiledCostModel(operator_profile, d)
    nvlink = ProfiledCostModel(operator_profile, Deployment(d.model, d.gpu, 2, interconnect="nvlink4"))
    shape = SHAPES[0]
    gen4_host = 35e9 * 25.8 / 40.1
    comm_pcie = 2 * 32 * (24e-6 + 48 * 4096 * 2 / gen4_host)
    comm_nvlink = 2 * 32 * (6e-6 + 48 * 4096 * 2 / 370e9)
    assert pcie.step_parts(shape).communication_s == pytest.approx(comm_pcie, rel=1e-12)
    assert pcie.step_time(shape) - nvlink.step_time(shape) == pytest.approx(comm_pcie - comm_nvlink, rel=1e-9)


# --- host time -----------------------------------------------------------------------------
def test_host_preset_is_the_line_through_vidurs_measurements():
    """Vidur's cpu_overheads.csv (A100, Llama-2-7B, TP 1), means in ms at batch 8 and 64."""
    rows = {8: (0.1648401111072185, 0.8792104815845104, 0.3520540002843036, 1.587266341198747),
            64: (0.8541185208238088, 1.319542252100431, 1.3231046175440917, 9.061571025791077)}
    total = {b: sum(r) * 1e-3 for b, r in rows.items()}
    sampling = {b: r[1] * 1e-3 for b, r in rows.items()}
    h = HOST_PRESETS["vllm-2023-a100"]
    for (step, seq), line in (((h.per_step_s, h.per_seq_s), total),
                              ((h.sampling_per_step_s, h.sampling_per_seq_s), sampling)):
        slope = (line[64] - line[8]) / 56
        assert seq == pytest.approx(slope, rel=2e-3)
        assert step == pytest.approx(line[8] - 8 * slope, rel=4e-3)
    assert h.seconds(0) == 0.0 and HOST_PRESETS["none"].seconds(100) == 0.0


def test_host_time_is_added_per_step_and_per_sequence(operator_profile):
    host = HostTime(per_step_s=1e-3, per_seq_s=2e-5, sampling_per_step_s=4e-4, sampling_per_seq_s=5e-6)
    m, g = MODELS["llama-3.1-8b"], GPUS["rtx4090"]
    plain, with_host = RooflineCostModel(m, g), RooflineCostModel(m, g, host=host)
    for shape in SHAPES:
        seqs = shape.prefill_seqs + shape.decode_seqs
        assert with_host.step_parts(shape).host_s == pytest.approx(1e-3 + 2e-5 * seqs, rel=1e-12)
        assert with_host.step_time(shape) - plain.step_time(shape) == pytest.approx(1e-3 + 2e-5 * seqs, rel=1e-9)
    assert with_host.decode_coefficients(64)[0] - plain.decode_coefficients(64)[0] == pytest.approx(1e-3 + 64 * 2e-5)
    # the operator profile times a sampler: its share is not counted twice
    d = Deployment(m, g)
    prof, prof_host = ProfiledCostModel(operator_profile, d), ProfiledCostModel(
        operator_profile, Deployment(m, g, host=host))
    assert "sampler" in operator_profile.tp[1].per_sequence
    for shape in SHAPES:
        seqs = shape.prefill_seqs + shape.decode_seqs
        extra = (1e-3 - 4e-4) + (2e-5 - 5e-6) * seqs
        assert prof_host.step_parts(shape).host_s == pytest.approx(extra, rel=1e-12)
        assert prof_host.step_time(shape) - prof.step_time(shape) == pytest.approx(extra, rel=1e-9)
    with pytest.raises(ValueError, match="sampling share cannot exceed"):
        HostTime(per_step_s=1e-4, sampling_per_step_s=2e-4)


# --- configuration -------------------------------------------------------------------------
BASE = {"name": "t", "model": {"name": "llama-2-13b"}, "hardware": {"gpu": "a100-80gb"},
        "workload": {"arrivals": {"kind": "poisson", "rate": 2.0},
                     "lengths": {"kind": "fixed", "prompt_tokens": 64, "output_tokens": 16}, "num_requests": 20}}


def cfg(**sections):
    raw = yaml.safe_load(yaml.safe_dump(BASE))
    for key, value in sections.items():
        raw[key] = {**raw.get(key, {}), **value}
    return validate_config(raw)


@pytest.mark.parametrize("sections,words", [
    ({"hardware": {"interconnect": "nvlink9"}}, ["hardware.interconnect", "unknown interconnect", "pcie-gen4"]),
    ({"hardware": {"interconnect": "none", "tensor_parallel": 2}}, ["interconnect", "'none' joins no GPUs"]),
    ({"hardware": {"gpu": "h100-pcie", "tensor_parallel": 4}}, ["interconnect", "nvlink4-bridge", "2 GPUs, not 4"]),
    ({"hardware": {"gpu": "mi300x", "tensor_parallel": 2}}, ["interconnect", "no measured link for mi300x"]),
    ({"hardware": {"interconnect": {"bus_bandwidth_gb_s": 0, "latency_s": 1e-5}}},
     ["hardware.interconnect", "bus_bandwidth_gb_s", "greater than 0"]),
    ({"hardware": {"interconnect": {"bus_bandwidth_gb_s": 10}}}, ["hardware.interconnect", "latency_s", "missing"]),
    ({"cost_model": {"host": "fast"}}, ["cost_model.host", "unknown host preset", "vllm-2023-a100"]),
    ({"cost_model": {"host": {"per_step_s": -1}}}, ["cost_model.host", "per_step_s", "greater than or equal to 0"]),
])
def test_bad_links_and_host_times_are_one_line_naming_the_key(sections, words):
    with pytest.raises(ConfigError) as e:
        cfg(**sections)
    msg = str(e.value)
    assert "\n" not in msg
    for w in words:
        assert w in msg, (w, msg)


def test_config_keys_reach_the_cost_model():
    c = cfg(hardware={"tensor_parallel": 2, "interconnect": {"bus_bandwidth_gb_s": 50, "latency_s": 1e-5}},
            cost_model={"host": {"per_step_s": 2e-3, "per_seq_s": 1e-5}})
    cost = make_cost_factory(c, None)()
    m = MODELS["llama-2-13b"]
    fixed, per_token = cost.communication_coefficients()
    assert (fixed, per_token) == pytest.approx((2 * 40 * 1e-5, 2 * 40 * 1.0 * 5120 * 2 / 50e9))
    assert cost.step_parts(BatchShape(decode_seqs=10, decode_context=1000)).host_s == pytest.approx(2e-3 + 1e-4)
    assert m.num_layers == 40
    again = validate_config(yaml.safe_load(yaml.safe_dump(c.model_dump(mode="json"))))  # a resolved config reloads
    assert again == c
    named = make_cost_factory(cfg(hardware={"tensor_parallel": 2, "interconnect": "pcie-gen5-x8-p2p"},
                                  cost_model={"host": "vllm-2023-a100"}), None)()
    assert named.communication_coefficients()[1] == pytest.approx(2 * 40 * 5120 * 2 / (40.1e9 / 2))
    assert named.host == HOST_PRESETS["vllm-2023-a100"]


def test_a_tp_run_reports_communication_in_its_summary_and_step_table():
    c = cfg(hardware={"tensor_parallel": 2}, engine={"macro_steps": False})
    result = run_experiment(c)
    steps = result.steps
    cost = make_cost_factory(c, None)()
    # one row per step: each row's communication is that step's, from the cost model's breakdown
    for _, row in steps.iterrows():
        p, d = int(row["prefill_tokens"]), int(row["decode_tokens"])
        shape = BatchShape(prefill_seqs=int(p > 0), prefill_tokens=p, decode_seqs=d, decode_context=d)
        assert row["communication_s"] == pytest.approx(cost.step_parts(shape).communication_s, rel=1e-12)
        assert 0 < row["communication_s"] < row["duration_s"]
    assert result.summary["communication_time_s"] == pytest.approx(steps["communication_s"].sum(), rel=1e-9)
    macro = run_experiment(cfg(hardware={"tensor_parallel": 2}))  # runs of steps: the same total
    assert macro.summary["communication_time_s"] == pytest.approx(result.summary["communication_time_s"], rel=1e-9)
    one = run_experiment(cfg())
    assert "communication_time_s" not in one.summary and "communication_s" not in one.steps


# --- the edges a mutation campaign found unchecked (mutation/README.md) -----------------------
def test_bandwidth_picks_the_nearest_measured_rank_count_ties_to_the_smaller():
    from kvsim.simulator.cost_model.interconnect import Collective

    c = Collective(((1, 5 * GB), (2, 100 * GB), (8, 50 * GB)), 0.0)
    assert c.bandwidth(1) == 5 * GB  # a measurement at one rank answers for one rank
    assert c.bandwidth(0) == 5 * GB  # (no ranks: read as one)
    assert c.bandwidth(4) == 100 * GB  # log2 distance 1 to both 2 and 8: the smaller count
    assert c.bandwidth(5) == 50 * GB  # nearer 8 (log2 0.68) than 2 (log2 1.32)


def test_send_recv_reads_the_two_rank_figure():
    from kvsim.simulator.cost_model.interconnect import Collective, LinkSpec

    link = LinkSpec("x", Collective(((2, 10 * GB), (4, 20 * GB)), 1e-5))  # 3 ranks would read the 4-rank 20 GB/s
    assert link_send_recv_s(link, 1e9) == pytest.approx(1e9 / 10e9 + 1e-5, rel=1e-15)


def test_measured_collectives_sort_their_points():
    from kvsim.simulator.cost_model.interconnect import Collective, _measured

    assert _measured(6e-6, (8, 480 * GB), (2, 370 * GB)) == Collective(((2, 370 * GB), (8, 480 * GB)), 6e-6)


def test_named_and_explicit_links_keep_their_names_and_own_collectives():
    from kvsim.simulator.cost_model.interconnect import explicit_link

    assert interconnect("PCIe-Gen4-x8-P2P").name == "pcie-gen4-x8-p2p"
    plain = explicit_link(10, 1e-5)
    assert plain.name == "explicit" and plain.all_to_all is None and plain.send_recv is None
    own = explicit_link(10, 1e-5, all_to_all=(5, 2e-5), send_recv=(20, 3e-5))
    assert own.name == "explicit"
    assert link_all_to_all_s(own, 4e6, 4) == pytest.approx(0.75 * 4e6 / 5e9 + 2e-5, rel=1e-15)
    assert link_send_recv_s(own, 4e6) == pytest.approx(4e6 / 20e9 + 3e-5, rel=1e-15)
    assert link_all_reduce_s(own, 4e6, 4) == pytest.approx(1.5 * 4e6 / 10e9 + 1e-5, rel=1e-15)
    only_send = explicit_link(10, 1e-5, send_recv=(20, 3e-5))  # all-to-all falls back to the all-reduce's
    assert link_all_to_all_s(only_send, 4e6, 4) == pytest.approx(0.75 * 4e6 / 10e9 + 1e-5, rel=1e-15)


def test_check_ranks_at_the_edges():
    from kvsim.simulator.cost_model.interconnect import check_ranks, tp_all_reduce_coefficients

    check_ranks(None, 1, "none")  # one GPU needs no link
    check_ranks(interconnect("nvlink4-bridge"), 2, "nvlink4-bridge")  # a bridge joins exactly two
    with pytest.raises(ValueError, match=r"^'nvlink4-bridge' joins 2 GPUs, not 3: set another link, e\.g\. "
                                         r"pcie-gen5-p2p$"):
        check_ranks(interconnect("nvlink4-bridge"), 3, "nvlink4-bridge")
    with pytest.raises(ValueError, match=r"^'none' joins no GPUs, so tensor_parallel 2 cannot run on it: set a link"):
        check_ranks(None, 2, "none")
    with pytest.raises(ValueError, match=r"^tensor_parallel 2 needs a GPU-to-GPU link \(hardware\.interconnect\)$"):
        tp_all_reduce_coefficients(32, 8192.0, None, 2)


def test_host_time_messages_and_without_sampling_exactly():
    from kvsim.simulator.cost_model.host_time import host_preset

    with pytest.raises(ValueError, match=r"^cost_model\.host\.per_seq_s: must be >= 0 seconds \(got -1\.0\)$"):
        HostTime(per_seq_s=-1.0)
    with pytest.raises(ValueError, match=r"^cost_model\.host: the sampling share cannot exceed the whole "
                                         r"\(sampling_per_step_s <= per_step_s, sampling_per_seq_s <= per_seq_s\)$"):
        HostTime(per_seq_s=1e-5, sampling_per_seq_s=2e-5)
    with pytest.raises(ValueError, match=r"^unknown host preset 'fast'; allowed: none, vllm-2023-a100 or "
                                         r"\{per_step_s, per_seq_s\}$"):
        host_preset("fast")
    host = HostTime(per_step_s=1e-3, per_seq_s=2e-5, sampling_per_step_s=4e-4, sampling_per_seq_s=5e-6)
    assert host.without_sampling() == HostTime(per_step_s=1e-3 - 4e-4, per_seq_s=2e-5 - 5e-6)
