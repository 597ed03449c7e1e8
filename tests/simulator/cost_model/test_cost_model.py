"""Roofline cost model: the formulas of DESIGN.md, checked against hand computation."""

import pytest

from kvsim.simulator.capacity import kv_slots
from kvsim.simulator.cost_model import GPUS, MODELS, BatchShape, RooflineCostModel, RooflineParams
from kvsim.simulator.cost_model.base import causal_attention_pairs
from kvsim.simulator.cost_model.catalogue import GiB
from kvsim.simulator.cost_model.roofline import paged_kernel_factor

NOMINAL_PARAMS = {  # published parameter counts (billions)
    "opt-13b": 12.85, "opt-66b": 65.7, "opt-175b": 174.6, "llama-2-7b": 6.74,
    "llama-2-13b": 13.0, "llama-2-70b": 69.0, "llama-3-8b": 8.03, "llama-3-70b": 70.6,
}


@pytest.mark.parametrize("name,billions", NOMINAL_PARAMS.items())
def test_catalogue_parameter_counts_match_published_sizes(name, billions):
    assert MODELS[name].num_params / 1e9 == pytest.approx(billions, rel=0.03)


def test_opt13b_kv_per_token_and_paper_slots():
    # Paper: 2 (K,V) x 5120 x 40 layers x 2 bytes = 800 KiB; 12 GiB of KV = 15.7K slots.
    assert MODELS["opt-13b"].kv_bytes_per_token == 800 * 1024
    assert kv_slots(12 * GiB, MODELS["opt-13b"]) == 15728


def test_gqa_shrinks_kv():
    assert MODELS["llama-2-70b"].kv_bytes_per_token == 2 * 80 * 8 * 128 * 2


def test_decode_step_is_weight_bound_at_small_batch():
    m, g = MODELS["llama-2-7b"], GPUS["a100-80gb"]
    p = RooflineParams(step_overhead_s=0.0)
    cost = RooflineCostModel(m, g, params=p, kernel="contiguous")
    t = cost.step_time(BatchShape(decode_seqs=1, decode_context=100))
    weights_s = m.weight_bytes / (g.hbm_bandwidth * p.memory_efficiency)
    attn_s = 100 * m.kv_bytes_per_token / (g.hbm_bandwidth * p.memory_efficiency)
    assert t == pytest.approx(weights_s + attn_s)


def test_decode_coefficients_reproduce_step_time():
    cost = RooflineCostModel(MODELS["llama-2-70b"], GPUS["a100-80gb"], tensor_parallel=2, block_size=16)
    for n, ctx in [(1, 10), (64, 64 * 900), (128, 128 * 3000)]:
        a, b = cost.decode_coefficients(n)
        assert a + b * ctx == pytest.approx(cost.step_time(BatchShape(decode_seqs=n, decode_context=ctx)))


def test_prefill_grows_quadratically_in_attention():
    cost = RooflineCostModel(MODELS["llama-2-7b"], GPUS["a100-80gb"])
    short = cost._prefill_pair_s * causal_attention_pairs(1000)
    long = cost._prefill_pair_s * causal_attention_pairs(2000)
    assert long / short == pytest.approx(4, rel=0.01)
    assert causal_attention_pairs(3, cached_tokens=2) == 3 * 2 + 6


def test_paged_overhead_falls_with_block_size_and_matches_paper_at_16():
    p = RooflineParams()
    factors = [paged_kernel_factor(b, p) for b in (1, 2, 4, 8, 16, 32, 64, 128, 256)]
    assert factors == sorted(factors, reverse=True)
    assert 1.20 <= paged_kernel_factor(16, p) <= 1.26  # Kwon et al. 2023, Fig. 18a


def test_tensor_parallel_splits_work_but_adds_allreduce():
    m, g = MODELS["llama-2-70b"], GPUS["a100-80gb"]
    one = RooflineCostModel(m, g, tensor_parallel=2)
    four = RooflineCostModel(m, g, tensor_parallel=4)
    shape = BatchShape(decode_seqs=32, decode_context=32 * 1000)
    assert four.step_time(shape) < one.step_time(shape)
    assert four._allreduce_token_s > one._allreduce_token_s > 0  # ring moves 2(tp-1)/tp of the bytes


def test_swap_time_pays_per_block_latency():
    m, g = MODELS["opt-13b"], GPUS["a100-40gb"]
    slots = 4096
    per_block = {b: RooflineCostModel(m, g, block_size=b).swap_time(slots // b) for b in (1, 16, 256)}
    assert per_block[1] > per_block[16] > per_block[256]
    batched = RooflineCostModel(m, g, block_size=1, params=RooflineParams(swap_batched=True)).swap_time(slots)
    nbytes = slots * m.kv_bytes_per_token
    link = RooflineCostModel(m, g).link
    assert batched == pytest.approx(2 * m.num_layers * link.latency + nbytes / link.bandwidth)
