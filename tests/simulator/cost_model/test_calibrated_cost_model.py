"""Calibrated cost model on the committed (synthetic) example profile.

Expected values are computed here from the profile's raw YAML numbers and model shapes
written out by hand from the published configs, not through the model's own helpers.
"""

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from kvsim.gpu_validation.synthetic_profile import EXAMPLE_PATH
from kvsim.simulator.cost_model import GPUS, MODELS, BatchShape, RooflineCostModel, RooflineParams
from kvsim.simulator.cost_model.base import Deployment, causal_attention_pairs
from kvsim.simulator.cost_model.calibrated import CalibratedCostModel, load_profile_for
from kvsim.simulator.cost_model.calibration_profile import ProfileError, read_profile, write_profile
from kvsim.simulator.cost_model.gemm_shapes import layer_gemms

RAW = yaml.safe_load(EXAMPLE_PATH.read_text())
NO_OVERHEAD = RooflineParams(step_overhead_s=0.0)


def table(n, k, m):
    """Seconds of an [m, k] @ [k, n] GEMM at a measured m, straight from the YAML."""
    for t in RAW["gemm"]["tables"]:
        if (t["n"], t["k"]) == (n, k):
            return t["seconds"][t["m"].index(m)]
    raise KeyError((n, k))


# Llama-3-8B (32 layers, hidden 4096, 32 q heads, 8 KV heads of 128, FFN 14336, vocab 128256)
LLAMA3_8B_GEMMS = [(6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336)]
LLAMA3_8B_LM_HEAD = (128256, 4096)


@pytest.fixture(scope="module")
def profile():
    return read_profile(EXAMPLE_PATH)


def model(profile, name="llama-3-8b", tp=1, block_size=16, kernel="paged", **kw):
    deployment = Deployment(MODELS[name], GPUS["a100-80gb"], tp, block_size, kernel)
    return CalibratedCostModel(profile, deployment, params=NO_OVERHEAD, **kw)


def test_decode_step_equals_profile_formulas(profile):
    cost = model(profile)
    seqs, context = 64, 64 * 1000
    d = RAW["decode_attention"]["paged"][16]
    linear = 32 * sum(table(n, k, 64) for n, k in LLAMA3_8B_GEMMS) + table(*LLAMA3_8B_LM_HEAD, 64)
    kv_bytes = context * 2 * 8 * 128 * 2  # per layer: K and V, 8 heads of 128, fp16
    attention = 32 * (d["a"] + d["b"] * kv_bytes + d["c"] * seqs * 8)
    got = cost.step_time(BatchShape(decode_seqs=seqs, decode_context=context))
    assert got == pytest.approx(linear + attention, rel=1e-12)


def test_prefill_step_equals_profile_formulas(profile):
    cost = model(profile, kernel="contiguous", block_size=1)
    pairs = causal_attention_pairs(512)
    f = RAW["prefill_attention"]["fit"]
    linear = 32 * sum(table(n, k, 512) for n, k in LLAMA3_8B_GEMMS) + table(*LLAMA3_8B_LM_HEAD, 1)
    attention = 32 * (f["a"] + f["b"] * 4 * 32 * 128 * pairs)
    got = cost.step_time(BatchShape(prefill_seqs=1, prefill_tokens=512, prefill_attn_pairs=pairs))
    assert got == pytest.approx(linear + attention, rel=1e-12)


def test_tensor_parallel_shapes_and_allreduce(profile):
    """Llama-2-70B on 2 GPUs: 32 q / 4 KV heads per GPU; all-reduces over the A100's NVLink."""
    cost = model(profile, name="llama-2-70b", tp=2)
    gemms = [(5120, 8192), (8192, 4096), (28672, 8192), (8192, 14336)]
    lm_head = (16000, 8192)
    seqs, context = 8, 8 * 2000
    d = RAW["decode_attention"]["paged"][16]
    linear = 80 * sum(table(n, k, 8) for n, k in gemms) + table(*lm_head, 8)
    attention = 80 * (d["a"] + d["b"] * context * 2 * 4 * 128 * 2 + d["c"] * seqs * 4)
    # NVLink 3 (A100): 230 GB/s all-reduce bus bandwidth, 6 us a call (interconnect.py's citations)
    allreduce = 2 * 80 * 6e-6 + 2 * 80 * (2 * 1 / 2) * 8192 * 2 / 230e9 * seqs
    got = cost.step_time(BatchShape(decode_seqs=seqs, decode_context=context))
    assert got == pytest.approx(linear + attention + allreduce, rel=1e-12)


def test_decode_coefficients_reproduce_step_time(profile):
    for kernel, bs in (("paged", 16), ("paged", 1), ("contiguous", 1)):
        cost = CalibratedCostModel(profile, Deployment(MODELS["llama-2-13b"], GPUS["a100-80gb"], 1, bs, kernel))
        for n, ctx in [(1, 10), (64, 64 * 900), (200, 200 * 3000)]:
            a, b = cost.decode_coefficients(n)
            assert a + b * ctx == pytest.approx(
                cost.step_time(BatchShape(decode_seqs=n, decode_context=ctx))
            )


def test_monotone_in_context_and_batch(profile):
    cost = model(profile, name="opt-13b")
    by_context = [
        cost.step_time(BatchShape(decode_seqs=32, decode_context=32 * c))
        for c in (1, 100, 1000, 2000)
    ]
    assert by_context == sorted(by_context) and len(set(by_context)) == 4
    by_batch = [
        cost.step_time(BatchShape(decode_seqs=n, decode_context=n * 500))
        for n in (1, 7, 64, 100, 256)
    ]
    assert by_batch == sorted(by_batch) and len(set(by_batch)) == 5
    prompts = [
        cost.step_time(BatchShape(1, p, causal_attention_pairs(p))) for p in (16, 300, 1000, 2048)
    ]
    assert prompts == sorted(prompts)


def test_paging_costs_more_with_smaller_blocks(profile):
    shape = BatchShape(decode_seqs=64, decode_context=64 * 2000)
    contiguous = model(profile, kernel="contiguous", block_size=1).step_time(shape)
    paged = [model(profile, block_size=bs).step_time(shape) for bs in (256, 16, 1)]
    assert contiguous < paged[0] < paged[1] < paged[2]


def test_close_to_roofline_built_from_the_same_datasheet(profile):
    """The example profile is a roofline of A100 specs at similar efficiencies to the
    hand-picked ones (the defaults before the roofline's fit): a decode-heavy step must land near
    that roofline's prediction."""
    from kvsim.simulator.cost_model.roofline import ROOFLINE_PRESETS

    shape = BatchShape(decode_seqs=128, decode_context=128 * 1500)
    calibrated = model(profile, name="llama-2-7b").step_time(shape)
    hand_picked = RooflineParams(**{**ROOFLINE_PRESETS["hand-picked"], "step_overhead_s": 0.0})
    roofline = RooflineCostModel(
        MODELS["llama-2-7b"], GPUS["a100-80gb"], params=hand_picked
    ).step_time(shape)
    assert calibrated == pytest.approx(roofline, rel=0.25)


def test_swap_and_copy_times(profile):
    per_block = model(profile)
    batched = model(profile, swap_batched=True)
    out, into = RAW["swap"]["per_block"]["out"], RAW["swap"]["per_block"]["in"]
    nbytes = 10 * 16 * 32 * 4096  # 10 blocks x 16 tokens x 32 layers x 4 KiB (K+V per layer)
    transfers = 2 * 32 * 10

    def link(f, n_transfers):
        return f["latency_s"] * n_transfers + nbytes / f["bytes_per_s"]

    assert per_block.swap_time(10) == pytest.approx(
        (link(out, transfers) + link(into, transfers)) / 2
    )
    bo, bi = RAW["swap"]["batched"]["out"], RAW["swap"]["batched"]["in"]
    assert batched.swap_time(10) == pytest.approx((link(bo, 32) + link(bi, 32)) / 2)
    assert batched.swap_time(10) < per_block.swap_time(10)
    assert per_block.swap_time(0) == 0.0
    # contiguous regions: 2 chunks holding 300 slots in all
    assert per_block.swap_time(2, num_slots=300) < per_block.swap_time(2, num_slots=600)
    c = RAW["block_copy"]["by_block_size"][16]
    assert per_block.copy_time(3) == pytest.approx(c["a"] + c["b"] * 3 * 16 * 32 * 4096)
    assert per_block.copy_time(0) == 0.0


def test_unmeasured_block_size_fails_at_construction(profile):
    with pytest.raises(ProfileError, match=r"no block size 12; measured: \[1, 2, 4, 8, 16"):
        model(profile, block_size=12)


def test_profile_round_trip_gives_identical_predictions(profile, tmp_path):
    again = read_profile(write_profile(profile, tmp_path / "copy.yaml"))
    shape = BatchShape(
        prefill_seqs=2,
        prefill_tokens=700,
        prefill_attn_pairs=1e5,
        decode_seqs=30,
        decode_context=9000,
    )
    assert model(again).step_time(shape) == model(profile).step_time(shape)


def test_load_profile_for_paths_and_names(tmp_path):
    assert load_profile_for("example-a100-80gb").metadata.synthetic is True
    assert load_profile_for("example-a100-80gb.yaml") == read_profile(EXAMPLE_PATH)
    (tmp_path / "configs").mkdir()
    write_profile(read_profile(EXAMPLE_PATH), tmp_path / "configs" / "mine.yaml")
    assert (
        load_profile_for("mine.yaml", tmp_path / "configs").metadata.gpu == "NVIDIA A100-SXM4-80GB"
    )
    with pytest.raises(ProfileError, match=r"cost_model.profile: 'nope.yaml' not found \(tried"):
        load_profile_for("nope.yaml", tmp_path)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_timed_gemms_of_a_layer_hold_exactly_its_weights(name):
    """The bench times, and the calibrated model looks up, one list of shapes (gemm_shapes);
    at TP 1 its matrices are the layer's weights, at TP 2 each GPU holds its half of them."""
    spec = MODELS[name]
    assert sum(n * k for n, k in layer_gemms(spec)) == spec.layer_params
    if spec.num_kv_heads % 2 == 0:
        assert 2 * sum(n * k for n, k in layer_gemms(spec, 2)) == spec.layer_params


def test_every_catalogue_model_runs_on_the_example_profile(profile):
    for name in (n for n, m in MODELS.items() if m.moe is None):  # (it times no MoE block)
        for tp in (1, 2, 4, 8):
            cost = model(profile, name=name, tp=tp)
            n, k = cost._gemms[0]
            assert (n, k) in profile.gemm_tables  # measured, no fallback needed
            assert cost.step_time(BatchShape(decode_seqs=4, decode_context=4000)) > 0


def test_simulator_side_imports_no_torch():
    code = "import sys, kvsim.simulator.cost_model.calibrated; assert 'torch' not in sys.modules and 'triton' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).parents[3])
