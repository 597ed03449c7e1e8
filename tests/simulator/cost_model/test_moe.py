"""Mixture-of-experts (``simulator.cost_model.moe``): shapes and weights, experts touched, the
MoE block's roofline and profiled times, expert/data parallelism, import and a run.

Expected values are computed by hand from the formulas' sources (the module docstring), so a
wrong formula or constant fails here, not only a changed one."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import yaml

from kvsim.simulator.capacity import weight_bytes_per_gpu
from kvsim.simulator.config import ConfigError, load_config, validate_config
from kvsim.simulator.cost_model.base import BatchShape, Deployment
from kvsim.simulator.cost_model.catalogue import GPUS, MODELS
from kvsim.simulator.cost_model.interconnect import explicit_link
from kvsim.simulator.cost_model.moe import (
    MXFP4_BYTES,
    ExpertGroup,
    MoeGrid,
    MoeProfiled,
    MoeRoofline,
    MoeTable,
    active_block_params,
    ep_collectives_s,
    expected_experts_touched,
    expert_bytes,
    grouped_gemm_rows,
    moe_roofline_layer_s,
)
from kvsim.simulator.cost_model.operator_profile import (
    read_operator_profile,
    write_operator_profile,
)
from kvsim.simulator.cost_model.profile_import import BundleError, convert, import_bundle
from kvsim.simulator.cost_model.profiled import ProfiledCostModel
from kvsim.simulator.cost_model.roofline import RooflineCostModel, RooflineParams
from kvsim.simulator.engine.runner import run_experiment

ROOT = Path(__file__).resolve().parents[3]
CONFIG = ROOT / "configs" / "moe" / "qwen3-30b-a3b.yaml"
SHARED_BUNDLE = ROOT.parent / "shared" / "validation" / "profiles-rtxpro6000" / "qwen3-30b-a3b-instruct-2507"
QWEN = MODELS["qwen3-30b-a3b"]
EXPERT_BYTES = 3 * 2048 * 768 * 2  # one Qwen3-30B-A3B expert: gate, up, down of 2048 x 768, bf16
ROUTER = 2048 * 128  # its router's weights

# tp1/moe.csv of the RTX PRO 6000 profile of Qwen3-30B-A3B-Instruct-2507 (LLMServingSim, MIT,
# copyright (c) 2024 CASYS Lab at KAIST; shared/validation/profiles-rtxpro6000/SOURCES.md), as is.
MOE_CSV = """tokens,activated_experts,time_us
1,8,50.2297
2,8,56.1917
2,16,134.976
4,8,56.6397
4,16,135.221
4,32,234.315
8,8,51.638
8,16,126.751
8,32,225.589
8,64,423.073
16,8,57.1293
16,16,131.082
16,32,229.664
16,64,424.116
16,128,817.612
32,8,73.323
32,16,134.325
32,32,233.014
32,64,429.312
32,128,822.145
64,8,71.3167
64,16,134.549
64,32,235.594
64,64,432.672
64,128,827.81
128,8,79.2123
128,16,139.05
128,32,249.803
128,64,456.737
128,128,849.291
256,8,121.792
256,16,165.099
256,32,271.189
256,64,472.085
256,128,874.635
512,8,190.753
512,16,198.016
512,32,290.155
512,64,499.914
512,128,912.033
1024,8,324
1024,16,326.475
1024,32,357.131
1024,64,550.528
1024,128,970.35
2048,8,578.466
2048,16,586.187
2048,32,602.975
2048,64,681.888
2048,128,1066.6
"""


# --- shapes and weights ---------------------------------------------------------------------

@pytest.mark.parametrize("name,total,active,embeddings", [
    ("qwen3-30b-a3b", 30.5e9, 3.3e9, 2),     # model card: 30.5B, 3.3B activated
    ("qwen3-235b-a22b", 235e9, 22e9, 2),     # 235B, 22B
    ("mixtral-8x7b", 46.7e9, 12.9e9, 2),     # Jiang et al. 2024: 46.7B, 12.9B active
    # gpt-oss model card: 20.91B / 3.61B, 116.83B / 5.13B, active counting the unembedding only
    ("gpt-oss-20b", 20.91e9, 3.61e9, 1),
    ("gpt-oss-120b", 116.83e9, 5.13e9, 1),
    ("deepseek-v3", 671e9, 37e9, 2),         # 671B / 37B (MLA approximated: within 2%)
])
def test_catalogue_parameters_match_the_model_cards(name, total, active, embeddings):
    m = MODELS[name]
    embed = embeddings * m.vocab_size * m.hidden_size  # the embedding and the (untied) LM head
    activated = m.dense_params + m.moe.moe_layers(m.num_layers) * active_block_params(m) + embed
    assert m.num_params == pytest.approx(total, rel=0.015)
    assert activated == pytest.approx(active, rel=0.05)


def test_qwen3_30b_a3b_counts_every_expert_by_hand():
    # attention 2048 x (4096 + 2 x 512) + 4096 x 2048 per layer; 128 experts + router per layer
    attention = 2048 * 4096 + 2 * 2048 * 512 + 4096 * 2048
    per_layer = attention + 128 * 3 * 2048 * 768 + ROUTER
    assert QWEN.num_params == 48 * per_layer + 2 * 151936 * 2048
    assert QWEN.weight_bytes == 2 * QWEN.num_params


def test_gpt_oss_experts_are_mxfp4_and_the_rest_bf16():
    m = MODELS["gpt-oss-20b"]
    experts = 24 * 32 * 3 * 2880 * 2880
    assert MXFP4_BYTES == 0.53125  # 4 bits + an 8-bit scale per 32 values
    assert m.weight_bytes == round((m.num_params - experts) * 2 + experts * 0.53125)
    assert 13.5e9 < m.weight_bytes < 14e9  # the checkpoint: 13.8 GB


def test_expert_weights_per_gpu_follow_the_expert_group():
    one = weight_bytes_per_gpu(QWEN, 1)
    ep2 = weight_bytes_per_gpu(QWEN, 1, ExpertGroup(1, 2, True))  # DP 2 + EP: 64 whole experts each
    tp2 = weight_bytes_per_gpu(QWEN, 2)  # TP 2: half of every expert, half of attention
    assert one - ep2 == 48 * 64 * EXPERT_BYTES
    assert tp2 < ep2  # TP also splits attention and embeddings; DP engines hold them whole
    assert tp2 == pytest.approx(one / 2, rel=0.01)
    # an uneven expert-parallel split holds the larger share (3 GPUs: 43 of 128 experts)
    assert one - weight_bytes_per_gpu(QWEN, 1, ExpertGroup(1, 3, True)) == 48 * (128 - 43) * EXPERT_BYTES


# --- experts touched, tiles ------------------------------------------------------------------

def test_expected_experts_touched_by_hand():
    assert expected_experts_touched(0, 8, 128) == 0
    assert expected_experts_touched(1, 8, 128) == pytest.approx(8)
    assert expected_experts_touched(2, 8, 128) == pytest.approx(128 * (1 - (15 / 16) ** 2))  # 15.5
    assert expected_experts_touched(2, 8, 128) == pytest.approx(15.5)
    assert expected_experts_touched(3, 2, 8) == pytest.approx(8 * (1 - 0.75 ** 3))  # Mixtral: 4.625
    assert expected_experts_touched(10_000, 8, 128) == pytest.approx(128)


def test_expected_experts_touched_agrees_with_sampling():
    import random

    rng, e, k, t = random.Random(0), 32, 4, 6
    runs = [len({x for _ in range(t) for x in rng.sample(range(e), k)}) for _ in range(20000)]
    assert sum(runs) / len(runs) == pytest.approx(expected_experts_touched(t, k, e), rel=0.01)


def test_grouped_gemm_rows_pad_each_expert_to_whole_tiles():
    assert grouped_gemm_rows(16, 15.5, 16) == pytest.approx(15.5 * 16)  # ~1 row each: one tile each
    assert grouped_gemm_rows(100, 10, 16) == 160  # 10 rows each: one tile of 16
    assert grouped_gemm_rows(16384, 128, 64) == 16384  # 128 rows each: two full tiles, no padding
    assert grouped_gemm_rows(130 * 10, 10, 64) == 10 * 192  # 130 rows: three tiles
    assert grouped_gemm_rows(0, 0, 16) == 0


# --- the roofline MoE block ------------------------------------------------------------------

def test_roofline_layer_one_token_reads_k_experts():
    t = moe_roofline_layer_s(QWEN, ExpertGroup(), 1, flops_per_s=1e15, bytes_per_s=1e12)
    assert t == pytest.approx((8 * EXPERT_BYTES + 2 * ROUTER) / 1e12)  # memory-bound: 76.0 us


def test_roofline_layer_large_step_is_compute_bound_in_whole_tiles():
    t = moe_roofline_layer_s(QWEN, ExpertGroup(), 2048, flops_per_s=1e14, bytes_per_s=1e12)
    flops = 2 * 16384 * (3 * 2048 * 768) + 2 * 2048 * ROUTER  # 2048 tokens x 8 pairs, tiles of 64
    assert t == pytest.approx(flops / 1e14, rel=1e-6)


def test_roofline_layer_small_steps_pay_for_padded_tiles():
    # 64 tokens: 127.3 experts touched with ~4 rows each, computed as tiles of 16 rows
    touched = expected_experts_touched(64, 8, 128)
    t = moe_roofline_layer_s(QWEN, ExpertGroup(), 64, flops_per_s=1e12, bytes_per_s=1e15)
    assert t == pytest.approx((2 * touched * 16 * 3 * 2048 * 768 + 2 * 64 * ROUTER) / 1e12)


def test_roofline_layer_under_expert_parallelism():
    # DP 2 + EP: the group's 2 tokens touch 15.5 experts, 7.75 on this GPU, 8 pairs of 16
    t = moe_roofline_layer_s(QWEN, ExpertGroup(1, 2, True), 1, flops_per_s=1e15, bytes_per_s=1e12)
    assert t == pytest.approx((7.75 * EXPERT_BYTES + 2 * ROUTER) / 1e12)
    # TP 2 without EP: every touched expert, half of each
    t = moe_roofline_layer_s(QWEN, ExpertGroup(2, 1, False), 1, flops_per_s=1e15, bytes_per_s=1e12)
    assert t == pytest.approx((8 * EXPERT_BYTES / 2 + 2 * ROUTER) / 1e12)


def test_roofline_cost_model_adds_the_moe_block_to_the_other_weights():
    gpu, p = GPUS["rtx-pro-6000"], RooflineParams(compute_efficiency=0.5, memory_efficiency=0.8)
    c = RooflineCostModel(QWEN, gpu, params=p)
    bw, flops = gpu.hbm_bandwidth * 0.8, gpu.peak_flops * 0.5
    other = QWEN.weight_bytes - 48 * (128 * EXPERT_BYTES + 2 * ROUTER)  # attention, embeddings, LM head
    a, b = c.decode_coefficients(1)
    moe = 48 * moe_roofline_layer_s(QWEN, ExpertGroup(), 1, flops, bw)
    assert moe == pytest.approx(48 * (8 * EXPERT_BYTES + 2 * ROUTER) / bw)
    assert a == pytest.approx(other / bw + moe + p.step_overhead_s)
    # far less than reading every expert, which a dense stand-in of the same size would
    assert a < QWEN.weight_bytes / bw / 4


def test_data_parallel_collectives_by_hand():
    link = explicit_link(10.0, 20e-6)  # 10 GB/s bus bandwidth, 20 us a call
    g = ExpertGroup(1, 2, True)
    nbytes = 4 * 2 * 2048 * 2  # 4 tokens per engine, 2 engines, hidden 2048, bf16
    one = 0.5 * nbytes / 10e9 + 20e-6
    assert ep_collectives_s(QWEN, g, link, 4) == pytest.approx(2 * 48 * one)
    assert ep_collectives_s(QWEN, ExpertGroup(2, 1, True), link, 4) == 0  # one engine: TP's all-reduce
    assert ep_collectives_s(QWEN, g, link, 0) == 0
    r = MoeRoofline(QWEN, g, 1e15, 1e12, link)
    fixed, per_token = r.communication_coefficients()
    assert fixed + 7 * per_token == pytest.approx(r.communication_s(7))
    with pytest.raises(ValueError, match="needs a GPU-to-GPU link"):
        MoeRoofline(QWEN, g, 1e15, 1e12, None)


# --- the profiled MoE block ------------------------------------------------------------------

def moe_grid() -> MoeGrid:
    rows = [line.split(",") for line in MOE_CSV.strip().splitlines()[1:]]
    pts = {(int(t), int(a)): float(us) * 1e-6 for t, a, us in rows}
    tokens, experts = sorted({k[0] for k in pts}), sorted({k[1] for k in pts})
    return MoeGrid(tuple(tokens), tuple(experts), tuple(pts.get((t, a)) for t in tokens for a in experts))


def test_moe_grid_gives_the_models_experts():
    g = moe_grid()
    assert (g.num_experts, g.experts_per_token) == (128, 8)


def test_moe_table_measured_points_and_the_triangle_by_hand():
    table = MoeTable(moe_grid())
    assert table.time(16, 128) == pytest.approx(817.612e-6)
    assert table.time(1, 8) == pytest.approx(50.2297e-6)
    # 3 tokens, 22.5 experts: the 16-expert column at 3 tokens (between 2 and 4), the 32-expert
    # column starts at 4 tokens (clamped there), then 6.5/16 of the way between the columns
    col16 = 134.976 + 0.5 * (135.221 - 134.976)
    assert table.time(3, 22.5) == pytest.approx((col16 + 6.5 / 16 * (234.315 - col16)) * 1e-6)


def test_moe_table_counts_lookups_outside_the_grid():
    seen = []
    table = MoeTable(moe_grid(), count=lambda axis, side: seen.append((axis, side)))
    table.time(16, 32)
    assert seen == []  # inside
    table.time(4096, 128)
    assert ("moe_tokens", 1) in seen
    table.time(1, 4)
    assert ("moe_experts", -1) in seen


def test_profiled_moe_looks_up_the_expected_experts():
    g = moe_grid()
    one = MoeProfiled(g, QWEN, ExpertGroup(), None)
    assert one.compute_s(1) == pytest.approx(48 * 50.2297e-6)
    assert one.compute_s(2) == pytest.approx(48 * MoeTable(g).time(2, 15.5))
    tp2 = MoeProfiled(g, QWEN, ExpertGroup(2, 1, False), explicit_link(10, 1e-5))
    assert tp2.compute_s(16) == pytest.approx(48 * MoeTable(g).time(16, expected_experts_touched(16, 8, 128)) / 2)
    # EP over 2 engines of 64 tokens: 1,024 pairs on this GPU (the table's 64 tokens), ~64 experts
    ep = MoeProfiled(g, QWEN, ExpertGroup(1, 2, True), explicit_link(10, 1e-5))
    assert ep.compute_s(64) == pytest.approx(48 * MoeTable(g).time(64, expected_experts_touched(128, 8, 128) / 2))


# --- import, profile format, cost model ------------------------------------------------------

MOE_META = {
    "profiler_version": "1.0.0", "vllm_version": "0.19.0", "cuda_version": "13.0",
    "gpu": "NVIDIA RTX PRO 6000 Blackwell Server Edition", "hardware": "RTXPRO6000",
    "profiled_at": "2026-04-24T12:44:06+00:00", "architecture": "qwen3_moe",
    "model": "Qwen/Qwen3-30B-A3B-Instruct-2507", "variant": "bf16", "tp_degrees": [1],
    "engine_effective": {"enforce_eager": True, "block_size": 16, "hf_overrides": {
        "num_hidden_layers": 1, "intermediate_size": 6144, "num_attention_heads": 32,
        "num_key_value_heads": 4, "vocab_size": 151936}},
    "measurement_iterations": 3,
}
MOE_DENSE_OPS = ("embedding", "layernorm", "qkv_proj", "qk_norm", "rotary_emb", "o_proj", "final_layernorm")


def write_moe_bundle(root: Path, moe_csv: str | None = MOE_CSV) -> Path:
    """A small qwen3_moe bundle: synthetic dense and attention tables, the real moe.csv."""
    (root / "tp1").mkdir(parents=True)
    (root / "meta.yaml").write_text(yaml.safe_dump(MOE_META))
    rows = ["layer,tokens,time_us"] + [f"{op},{t},{2 + t * 0.01}" for op in MOE_DENSE_OPS
                                       for t in (1, 16, 256, 2048)]
    (root / "tp1" / "dense.csv").write_text("\n".join(rows) + "\n")
    (root / "tp1" / "per_sequence.csv").write_text(
        "layer,sequences,time_us\nlm_head,1,100\nlm_head,256,400\nsampler,1,20\nsampler,256,60\n")
    attention = ["0,0,1,16,8", "0,0,1,16384,80", "0,0,256,16,20", "0,0,256,16384,4000",
                 "16,0,0,0,10", "2048,0,0,0,300", "16,16384,0,0,90", "2048,16384,0,0,2000", "16,0,1,16,14"]
    (root / "tp1" / "attention.csv").write_text("prefill_chunk,kv_prefill,n_decode,kv_decode,time_us\n"
                                                + "\n".join(attention) + "\n")
    if moe_csv is not None:
        (root / "tp1" / "moe.csv").write_text(moe_csv)
    return root


def test_import_reads_a_qwen3_moe_bundle_and_its_moe_table(tmp_path):
    profile, _, _ = convert(write_moe_bundle(tmp_path / "b"))
    assert profile.model["num_experts"] == 128 and profile.model["experts_per_token"] == 8
    assert "gate_up_proj" not in profile.per_layer and profile.per_layer["qk_norm"] == 1
    grid = profile.tp[1].moe
    assert grid == moe_grid()
    path = write_operator_profile(profile, tmp_path / "p.yaml")
    assert read_operator_profile(path).tp[1].moe == grid  # the format keeps it


def test_import_refuses_a_moe_bundle_without_its_moe_table(tmp_path):
    with pytest.raises(BundleError, match=r"tp1/moe.csv: missing \(architecture qwen3_moe runs a MoE block"):
        convert(write_moe_bundle(tmp_path / "b", moe_csv=None))
    with pytest.raises(BundleError, match=r"moe.csv: no row at tokens 1"):
        convert(write_moe_bundle(tmp_path / "c", moe_csv="tokens,activated_experts,time_us\n2,16,1.0\n"))


def test_profiled_cost_model_times_moe_layers_and_refuses_a_dense_model(tmp_path):
    profile, _, _ = convert(write_moe_bundle(tmp_path / "b"))
    c = ProfiledCostModel(profile, Deployment(QWEN, GPUS["rtx-pro-6000"]))
    no_moe = c.step_time(BatchShape(decode_seqs=1, decode_context=100)) - c.moe.compute_s(1)
    assert c.moe.compute_s(1) == pytest.approx(48 * 50.2297e-6)
    assert no_moe > 0
    from kvsim.simulator.cost_model.operator_profile import OperatorProfileError
    with pytest.raises(OperatorProfileError, match="num_experts 128 vs None"):
        ProfiledCostModel(profile, Deployment(MODELS["qwen3-32b"], GPUS["rtx-pro-6000"]))


@pytest.mark.skipif(not SHARED_BUNDLE.is_dir(), reason="shared/validation not beside the checkout")
def test_the_shipped_rtx_pro_6000_moe_bundle_imports(tmp_path):
    path = import_bundle(SHARED_BUNDLE, tmp_path)
    profile = read_operator_profile(path)
    assert profile.tp[1].moe == moe_grid() and profile.tp[2].moe is None
    c = ProfiledCostModel(profile, Deployment(QWEN, GPUS["rtx-pro-6000"], 2))
    assert c.step_time(BatchShape(decode_seqs=8, decode_context=8000)) > 0


# --- config and runs --------------------------------------------------------------------------

def raw(**hardware):
    return {"model": {"name": "qwen3-30b-a3b", "context_len_tokens": 8192},
            "hardware": {"gpu": "rtx-pro-6000", **hardware},
            "workload": {"arrivals": {"kind": "poisson", "rate": 1}, "lengths": {"kind": "fixed",
                         "prompt_tokens": 100, "output_tokens": 10}, "num_requests": 5},
            "scheduler": {"policy": "vllm-v1"}}


def test_config_model_shape_with_experts():
    cfg = validate_config({**raw(), "model": {"name": "mine", "shape": {
        "num_layers": 4, "hidden_size": 512, "num_heads": 8, "num_kv_heads": 2, "intermediate_size": 1024,
        "vocab_size": 1000, "context_len_tokens": 4096, "moe": {
            "num_experts": 16, "experts_per_token": 2, "expert_intermediate_size": 256,
            "shared_expert_intermediate_size": 256, "dense_layers": 1}}}})
    m = cfg.model.spec
    assert (m.moe.num_experts, m.moe.experts_per_token, m.moe.dense_layers) == (16, 2, 1)
    attention = 512 * 512 + 2 * 512 * 128 + 512 * 512
    block = 512 * 16 + 16 * 3 * 512 * 256 + 3 * 512 * 256
    assert m.num_params == 4 * attention + 1 * 3 * 512 * 1024 + 3 * block + 2 * 1000 * 512


@pytest.mark.parametrize("change,message", [
    ({"model": {"name": "x", "shape": {"num_layers": 2, "hidden_size": 64, "num_heads": 4, "intermediate_size": 64,
                                       "vocab_size": 10, "context_len_tokens": 64,
                                       "moe": {"num_experts": 4, "experts_per_token": 5,
                                               "expert_intermediate_size": 8}}}},
     r"model\.shape\.moe: experts_per_token \(5\) is more than num_experts \(4\)"),
    ({"model": {"name": "llama-3.1-8b"}, "hardware": {"gpu": "rtx-pro-6000", "expert_parallel": True}},
     r"hardware\.expert_parallel: model llama-3.1-8b has no experts"),
    ({"cost_model": {"kind": "calibrated", "profile": "x.yaml"}},
     r"cost_model\.kind 'calibrated' does not time mixture-of-experts layers"),
    ({"hardware": {"gpu": "mi300x", "num_replicas": 2, "data_parallel": True}},
     r"hardware\.interconnect: 2 data-parallel engines of a MoE model exchange tokens"),
    ({"hardware": {"gpu": "rtx-pro-6000", "num_replicas": 3, "data_parallel": True, "expert_parallel": True}},
     r"hardware\.expert_parallel: 128 experts do not split evenly over 3 GPUs"),
])
def test_bad_moe_configs_are_one_line_errors_naming_the_key(change, message):
    with pytest.raises(ConfigError, match=message) as e:
        validate_config({**raw(), **change})
    assert "\n" not in str(e.value)


def test_data_parallel_engines_default_to_the_least_loaded_router_and_share_experts():
    cfg = validate_config(raw(num_replicas=2, data_parallel=True, expert_parallel=True))
    assert cfg.scheduler.router == "least_outstanding_tokens"
    assert cfg.expert_group == ExpertGroup(1, 2, True)
    single = validate_config(raw())
    assert single.scheduler.router == "round_robin" and single.expert_group == ExpertGroup(1, 1, False)
    # experts split over two GPUs: more KV per engine than one GPU holding all of them
    gained = cfg.memory_budget.kv_bytes - single.memory_budget.kv_bytes
    assert gained == pytest.approx(48 * 64 * EXPERT_BYTES, rel=1e-9)
    # a given router is kept
    cfg = validate_config({**raw(num_replicas=2, data_parallel=True),
                           "scheduler": {"policy": "vllm-v1", "router": "round_robin"}})
    assert cfg.scheduler.router == "round_robin"


def test_the_example_moe_config_runs_end_to_end():
    cfg, base = load_config(CONFIG, ["workload.num_requests=40", "metrics.step_table=true"])
    result = run_experiment(cfg, base)
    s = result.summary
    assert s["completed"] == 40 and s.get("rejected", 0) == 0
    assert s["communication_time_s"] > 0  # the engines' dispatch and combine
    assert set(result.requests["status"]) == {"finished"}


@pytest.mark.filterwarnings("ignore::kvsim.simulator.cost_model.profiled.ProfileExtrapolationWarning")
def test_a_profiled_moe_run_with_an_imported_profile(tmp_path):
    path = import_bundle(write_moe_bundle(tmp_path / "b"), tmp_path / "profiles")
    cfg, base = load_config(CONFIG, ["workload.num_requests=20", "cost_model.kind=profiled",
                                     f"cost_model.profile={path}"])
    result = run_experiment(cfg, base)
    assert result.summary["completed"] == 20
    assert math.isfinite(result.summary["mean_tpot_ms"]) and result.summary["mean_tpot_ms"] > 0


def test_expert_bytes_helper():
    assert expert_bytes(QWEN) == EXPERT_BYTES


def test_hf_config_to_the_moe_shape_section():
    from kvsim.simulator.cost_model.moe import hf_moe_shape

    qwen = {"num_experts": 128, "num_experts_per_tok": 8, "moe_intermediate_size": 768, "intermediate_size": 6144,
            "mlp_only_layers": [], "decoder_sparse_step": 1}
    assert hf_moe_shape(qwen) == {"num_experts": 128, "experts_per_token": 8, "expert_intermediate_size": 768,
                                  "shared_expert_intermediate_size": 0, "dense_layers": 0}
    gpt_oss = {"num_local_experts": 32, "experts_per_token": 4, "intermediate_size": 2880,
               "quantization_config": {"quant_method": "mxfp4"}}
    assert hf_moe_shape(gpt_oss)["expert_bytes_per_param"] == 0.53125
    deepseek = {"n_routed_experts": 256, "num_experts_per_tok": 8, "moe_intermediate_size": 2048,
                "n_shared_experts": 1, "first_k_dense_replace": 3}
    assert hf_moe_shape(deepseek)["shared_expert_intermediate_size"] == 2048
    assert hf_moe_shape(deepseek)["dense_layers"] == 3
    assert hf_moe_shape({"intermediate_size": 14336}) is None  # dense
    with pytest.raises(ValueError, match="mlp_only_layers"):
        hf_moe_shape({**qwen, "mlp_only_layers": [0, 5]})


# --- the edges a mutation campaign found unchecked (mutation/README.md) -----------------------

def small_moe_model():
    """4 layers (the first dense), hidden 512, 16 experts of 256 (2 per token), a shared expert of 256, bf16."""
    return validate_config({**raw(), "model": {"name": "mine", "shape": {
        "num_layers": 4, "hidden_size": 512, "num_heads": 8, "num_kv_heads": 2, "intermediate_size": 1024,
        "vocab_size": 1000, "context_len_tokens": 4096, "moe": {
            "num_experts": 16, "experts_per_token": 2, "expert_intermediate_size": 256,
            "shared_expert_intermediate_size": 256, "dense_layers": 1}}}}).model.spec


SMALL_EXPERT = 3 * 512 * 256  # gate, up, down of 512 x 256 (the shared expert is the same size)
SMALL_ROUTER = 512 * 16


def test_moe_spec_bounds_and_messages():
    from kvsim.simulator.cost_model.moe import MoESpec

    for ok in (MoESpec(4, 1, 1), MoESpec(4, 4, 8), MoESpec(4, 2, 8, shared_ffn_size=0, dense_layers=0)):
        assert ok.moe_layers(10) == 10 - ok.dense_layers
    with pytest.raises(ValueError, match=r"^experts_per_token \(5\) must be from 1 to num_experts \(4\)$"):
        MoESpec(4, 5, 8)
    for bad in ({"expert_ffn_size": 0}, {"shared_ffn_size": -1}, {"dense_layers": -1}):
        with pytest.raises(ValueError, match=r"^expert_ffn_size must be >= 1, shared_ffn_size and dense_layers >= 0$"):
            MoESpec(**{"num_experts": 4, "experts_per_token": 2, "expert_ffn_size": 8, **bad})


def test_hf_moe_shape_keys_and_messages():
    from kvsim.simulator.cost_model.moe import hf_moe_shape

    with pytest.raises(ValueError, match=r"^config\.json: num_experts_per_tok / moe_intermediate_size: missing for "
                                         r"a MoE model$"):
        hf_moe_shape({"num_experts": 64, "moe_intermediate_size": 1408})  # no experts per token
    dense_between = (r"^config\.json: mlp_only_layers / decoder_sparse_step: dense layers between MoE layers are not "
                     r"modelled \(only the first layers: first_k_dense_replace\)$")
    with pytest.raises(ValueError, match=dense_between):
        hf_moe_shape({"num_experts": 64, "num_experts_per_tok": 4, "moe_intermediate_size": 1408,
                      "decoder_sparse_step": 2})
    # Qwen1.5/2-MoE: one shared expert given by its own intermediate size
    qwen2 = {"num_experts": 60, "num_experts_per_tok": 4, "moe_intermediate_size": 1408,
             "shared_expert_intermediate_size": 5632}
    assert hf_moe_shape(qwen2)["shared_expert_intermediate_size"] == 5632
    assert "expert_bytes_per_param" not in hf_moe_shape({**qwen2, "quantization_config": {"quant_method": "fp8"}})


def test_mlp_params_gated_and_not():
    from kvsim.simulator.cost_model.moe import mlp_params

    assert mlp_params(10, 20, True) == 600 and mlp_params(10, 20, False) == 400


def test_grouped_gemm_rows_at_one_pair_and_no_experts():
    assert grouped_gemm_rows(1, 1, 16) == 16  # one row: one whole tile
    assert grouped_gemm_rows(5, 0, 16) == 0  # no expert touched: nothing computed


def test_moe_weights_with_shared_experts_by_hand():
    from kvsim.simulator.cost_model.moe import moe_weight_bytes, moe_weight_bytes_per_gpu

    m = small_moe_model()
    # 3 MoE layers; TP 2 without EP: half of each of 16 experts, half the shared expert, the router whole
    per_gpu = 3 * (16 * SMALL_EXPERT * 2 / 2 + (SMALL_ROUTER + SMALL_EXPERT / 2) * 2)
    assert moe_weight_bytes_per_gpu(m, ExpertGroup(2, 1, False)) == pytest.approx(per_gpu, rel=1e-15)
    assert moe_weight_bytes(m) == 3 * (16 * SMALL_EXPERT * 2 + (SMALL_ROUTER + SMALL_EXPERT) * 2)


def test_roofline_layer_with_shared_experts_under_tensor_parallelism_by_hand():
    m, g = small_moe_model(), ExpertGroup(2, 1, False)
    touched = 16 * (1 - (14 / 16) ** 4)  # 4 tokens, 2 of 16 experts each: 6.62 experts, ~1.2 rows each
    rows = touched * 16  # one tile of 16 rows per expert
    flops = 2 * rows * SMALL_EXPERT / 2 + 2 * 4 * SMALL_ROUTER + 2 * 4 * SMALL_EXPERT / 2  # experts, router, shared
    nbytes = touched * SMALL_EXPERT * 2 / 2 + (SMALL_ROUTER + SMALL_EXPERT / 2) * 2
    assert moe_roofline_layer_s(m, g, 4, flops_per_s=1e9, bytes_per_s=1e18) == pytest.approx(flops / 1e9, rel=1e-12)
    assert moe_roofline_layer_s(m, g, 4, flops_per_s=1e18, bytes_per_s=1e9) == pytest.approx(nbytes / 1e9, rel=1e-12)
    assert moe_roofline_layer_s(QWEN, ExpertGroup(), 0, 1e15, 1e12) == 0.0  # an empty step reads nothing


@pytest.mark.parametrize("tokens,tile", [(128, 16), (200, 64)])
def test_roofline_tile_is_16_rows_up_to_the_expert_count_then_64(tokens, tile):
    touched = expected_experts_touched(tokens, 8, 128)  # 8-12.5 rows per expert: one tile either way
    flops = 2 * touched * tile * 3 * 2048 * 768 + 2 * tokens * ROUTER
    t = moe_roofline_layer_s(QWEN, ExpertGroup(), tokens, flops_per_s=1e12, bytes_per_s=1e18)
    assert t == pytest.approx(flops / 1e12, rel=1e-12)


def test_collectives_need_a_link_only_across_engines():
    assert ep_collectives_s(QWEN, ExpertGroup(2, 1, True), None, 4) == 0.0  # one engine: no link needed
    with pytest.raises(ValueError, match=r"^data-parallel MoE over 2 engines needs a GPU-to-GPU link "
                                         r"\(hardware\.interconnect\)$"):
        ep_collectives_s(QWEN, ExpertGroup(1, 2, True), None, 4)
    assert MoeRoofline(QWEN, ExpertGroup(2, 1, False), 1e15, 1e12, None).communication_coefficients() == (0.0, 0.0)


def test_moe_table_message_and_counts_at_the_grid_edges():
    with pytest.raises(ValueError, match=r"^moe table: an activated_experts value with no measured time$"):
        MoeTable(MoeGrid((1, 2), (8, 16), (1e-5, None, 2e-5, None)))
    seen = []
    table = MoeTable(moe_grid(), count=lambda axis, side: seen.append((axis, side)))
    table.time(1, 8)  # the grid's first point
    table.time(1.5, 8)  # inside the 8-expert column
    table.time(1.5, 12)  # below the 16-expert column's start (2 tokens), inside the triangle: not counted
    assert seen == []
    assert table.time(0.5, 8) == pytest.approx(50.2297e-6)  # below every column: clamped, counted below
    assert seen == [("moe_tokens", -1)]
    seen.clear()
    table.time(4096, 16)  # on a measured experts column: the next column is not looked up
    assert seen == [("moe_tokens", 1)]


def test_profiled_moe_edges():
    g, seen = moe_grid(), []
    p = MoeProfiled(g, QWEN, ExpertGroup(), None, count=lambda axis, side: seen.append((axis, side)))
    assert p.compute_s(0) == 0.0 and seen == []
    t = p.compute_s(4096)
    assert seen == [("moe_tokens", 1)]  # above the grid, counted
    assert p.compute_s(4096) == t and seen == [("moe_tokens", 1)]  # the same step again: from the cache
    with pytest.raises(ValueError, match=r"^model mine: a profiled MoE model with dense MLP layers \(1\) is not "
                                         r"supported \(the profile's layers have no MLP\)$"):
        MoeProfiled(g, small_moe_model(), ExpertGroup(), None)


def test_profiled_moe_cache_holds_65536_steps_then_starts_again():
    """A step size looked up again is answered from the cache (counted once) until 65,536 sizes are
    held; the next new size clears it, so the first size is looked up, and counted, again."""
    seen = []
    p = MoeProfiled(moe_grid(), QWEN, ExpertGroup(), None, count=lambda axis, side: seen.append(side))
    first = 4096  # above the grid: every new size is counted
    for tokens in range(first, first + 65536):
        p.compute_s(tokens)
    p.compute_s(first)
    assert len(seen) == 65536  # still cached
    p.compute_s(first + 65536)  # the 65,537th size: the cache starts again
    p.compute_s(first)
    assert len(seen) == 65538
