"""The roofline cost model's every term, on a tiny model and GPU worked out by hand.

Model (``ModelSpec``): 2 layers, hidden 8, 2 heads of 4 (d_q 8), 1 KV head, gated FFN 16,
vocabulary 32, 2 bytes a value. Then: KV 2 x 2 x 1 x 4 x 2 = 32 bytes a token; a layer
64 (Q) + 2 x 32 (K, V) + 64 (O) + 3 x 128 (MLP) = 576 weights, 1,152 in the layers; embedding
and LM head 256 each: 1,664 weights, 3,328 bytes.
GPU: 16,384 FLOP/s, 1,024 B/s, host link PCIe 4.0. Constants: compute efficiency 0.5
(8,192 FLOP/s reached), memory 0.25 (256 B/s), paged overhead 1 + 0.5 + 2 / block size,
step overhead 0.125 s. Block size 4: the paged factor is 2.

On one GPU: weights 3,328 / 256 = 13 s a step; 2 x 1,152 = 2,304 FLOPs a token, LM head
2 x 256 = 512 a sampled sequence; prefill attention 4 x 8 x 2 / 8,192 = 1/128 s a query-key
pair; decode attention per context token max(32 / 256, 64 / 8,192) = 1/8 s, times 2 (paged).
Every number is a power of two or a short sum of them: the expectations are exact.
"""

from __future__ import annotations

import pytest

from kvsim.simulator.cost_model.base import BatchShape
from kvsim.simulator.cost_model.catalogue import GPUSpec, ModelSpec
from kvsim.simulator.cost_model.host_time import HostTime
from kvsim.simulator.cost_model.interconnect import Collective, LinkSpec
from kvsim.simulator.cost_model.roofline import (
    ACROSS_PROFILES,
    ROOFLINE_PRESETS,
    RooflineCostModel,
    RooflineParams,
    allreduce_coefficients,
    default_efficiencies,
    paged_kernel_factor,
    roofline_preset,
)

MODEL = ModelSpec("tiny", 2, 8, 2, 1, 16, 32, 1024, True)
GPU = GPUSpec("toy", 1 << 30, 1024.0, 16384.0, 0.0, "gen4")
PARAMS = RooflineParams(compute_efficiency=0.5, memory_efficiency=0.25, paged_overhead_base=0.5,
                        paged_overhead_per_block=2.0, step_overhead_s=0.125)
LINK = LinkSpec("toy-link", Collective(((2, 64.0),), 0.5))  # 64 B/s bus bandwidth, 0.5 s a call


def roofline(**kw) -> RooflineCostModel:
    kw.setdefault("block_size", 4)
    kw.setdefault("params", PARAMS)
    return RooflineCostModel(MODEL, GPU, **kw)


def test_the_tiny_model_s_shapes():
    """The facts the docstring's arithmetic starts from."""
    assert (MODEL.kv_bytes_per_token, MODEL.dense_params, MODEL.weight_bytes) == (32, 1152, 3328)


def test_a_mixed_step_is_the_sum_of_its_parts():
    """A chunk of 4 tokens (10 pairs) and 2 decodes over 8 tokens of context: 6 tokens, 3
    sampled. Linear: max(13, (2,304 x 6 + 512 x 3) / 8,192 = 1.875) = 13 (weight-bound);
    attention 10 / 128; decode 8 x 1/8 x 2 = 2; no communication on one GPU; overhead 0.125."""
    shape = BatchShape(prefill_seqs=1, prefill_tokens=4, prefill_attn_pairs=10, decode_seqs=2, decode_context=8)
    assert roofline().step_time(shape) == 13 + 10 / 128 + 2 + 0.125


def test_a_long_prefill_is_compute_bound():
    """64 prompt tokens, 2,080 pairs: linear (2,304 x 64 + 512) / 8,192 = 18.0625 > 13; pairs
    2,080 / 128 = 16.25; + 0.125."""
    shape = BatchShape(prefill_seqs=1, prefill_tokens=64, prefill_attn_pairs=2080)
    assert roofline().step_time(shape) == 18.0625 + 16.25 + 0.125
    assert roofline().linear_time(64, 1) == 18.0625
    assert roofline().linear_time(1, 1) == 13.0


def test_without_the_lm_head():
    """``lm_head: False``: its 256 x 2 bytes are not read (weights 2,816 / 256 = 11 s) and the
    sampled sequences cost no FLOPs: 64 tokens take 2,304 x 64 / 8,192 = 18."""
    r = roofline(params=RooflineParams(**{**PARAMS.__dict__, "lm_head": False}))
    assert r.linear_time(1, 1) == 11.0
    assert r.linear_time(64, 1) == 18.0
    assert r.linear_time(64, 64) == 18.0


def test_the_paged_factor_and_a_contiguous_kernel():
    """Paged at block 4: 1 + 0.5 + 2 / 4 = 2, at block 16: 1.625; a contiguous kernel 1. One
    decode over 16 tokens of context: 13 + 16 x 1/8 x factor + 0.125."""
    assert paged_kernel_factor(4, PARAMS) == 2.0
    assert paged_kernel_factor(16, PARAMS) == 1.625
    one = BatchShape(decode_seqs=1, decode_context=16)
    assert roofline().step_time(one) == 13 + 4 + 0.125
    assert roofline(block_size=16).step_time(one) == 13 + 16 / 8 * 1.625 + 0.125
    assert roofline(kernel="contiguous").step_time(one) == 13 + 2 + 0.125
    assert roofline().decode_coefficients(1) == (13.125, 0.25)


def test_decode_attention_takes_the_slower_of_bytes_and_flops():
    """A GPU 64x slower at compute (256 FLOP/s, 128 reached): per context token the FLOPs take
    64 / 128 = 0.5 s, more than the bytes' 1/8: decode attention 0.5 x 2 = 1 s a token. The
    weights still take 13 s; linear compute of one token (2,304 + 512) / 128 = 22 s."""
    slow = GPUSpec("slow", 1 << 30, 1024.0, 256.0, 0.0, "gen4")
    r = RooflineCostModel(MODEL, slow, block_size=4, params=PARAMS)
    assert r.decode_coefficients(1)[1] == 1.0
    assert r.step_time(BatchShape(decode_seqs=1, decode_context=3)) == 22 + 3 + 0.125


def test_an_empty_step_costs_nothing():
    assert roofline().step_time(BatchShape()) == 0.0
    assert roofline(tensor_parallel=2, interconnect=LINK).step_time(BatchShape()) == 0.0


def test_tensor_parallel_halves_the_work_and_adds_two_all_reduces_a_layer():
    """TP 2 over a link of 64 B/s, 0.5 s a call: 4 all-reduces (2 layers x 2), fixed 4 x 0.5 =
    2 s, per token 4 x 2 (2 - 1) / 2 x 16 bytes / 64 = 1 s. Per GPU: weights 6.5 s, decode
    attention 1/16 s a token (x 2 paged). Two decodes over 8 tokens: linear max(6.5,
    (1,152 x 2 + 256 x 2) / 8,192) = 6.5, attention 8 x 1/8 = 1, communication 2 + 2 x 1 = 4,
    overhead 0.125: 11.625. Prefill pairs cost 1/256 s each."""
    r = roofline(tensor_parallel=2, interconnect=LINK)
    assert allreduce_coefficients(MODEL, LINK, 2) == (2.0, 1.0)
    assert allreduce_coefficients(MODEL, LINK, 1) == (0.0, 0.0)
    assert r.communication_coefficients() == (2.0, 1.0)
    assert r.communication_time(3) == 5.0
    assert r.communication_time(0) == 0.0
    assert r.step_time(BatchShape(decode_seqs=2, decode_context=8)) == 6.5 + 1 + 4 + 0.125
    assert r.decode_coefficients(2) == (6.5 + 4 + 0.125, 0.125)
    assert r.step_time(BatchShape(prefill_seqs=1, prefill_tokens=64, prefill_attn_pairs=256)) == \
        9.03125 + 1 + 2 + 64 + 0.125  # linear (1,152 x 64 + 256) / 8,192 > 6.5; 256 pairs / 256
    assert r.linear_time(64, 1) == 9.03125
    # one GPU: no link needed, nothing to communicate
    assert roofline().communication_coefficients() == (0.0, 0.0)
    assert roofline().communication_time(5) == 0.0


def test_the_gpu_s_own_link_by_default():
    """No ``interconnect`` given: the GPU's catalogue link (here none, so TP 1 only); a link
    given by name is looked up."""
    assert roofline().gpu_link is None
    named = roofline(interconnect="nvlink4")
    assert named.gpu_link is not None and named.gpu_link.name.lower().startswith("nvlink")


def test_host_time_per_step_and_per_sampled_sequence():
    """Host 0.25 s a step and 0.125 s a sampled sequence: a step of one chunk and 2 decodes
    (3 sampled) pays 0.25 + 0.375 on top of the GPU's time; decode_coefficients include it."""
    host = HostTime(per_step_s=0.25, per_seq_s=0.125)
    shape = BatchShape(prefill_seqs=1, prefill_tokens=4, prefill_attn_pairs=10, decode_seqs=2, decode_context=8)
    assert roofline(host=host).step_time(shape) == roofline().step_time(shape) + 0.625
    assert roofline(host=host).decode_coefficients(2) == (13 + 0.125 + 0.5, 0.25)


def test_swap_time_per_block_per_layer_k_and_v():
    """PCIe 4.0: 25.6 GB/s, 10 us a transfer. 3 blocks of 4 slots: 2 x 2 layers x 3 = 12
    transfers, 12 x 32 = 384 bytes. Batched: 4 transfers. 5 slots given: 160 bytes. TP 2:
    half the bytes. No block (or fewer): 0."""
    r = roofline()
    assert r.swap_time(3) == pytest.approx(12 * 10e-6 + 384 / 25.6e9, rel=1e-12)
    assert r.swap_time(3, 5) == pytest.approx(12 * 10e-6 + 160 / 25.6e9, rel=1e-12)
    batched = roofline(params=RooflineParams(**{**PARAMS.__dict__, "swap_batched": True}))
    assert batched.swap_time(3) == pytest.approx(4 * 10e-6 + 384 / 25.6e9, rel=1e-12)
    assert roofline(tensor_parallel=2, interconnect=LINK).swap_time(3) == pytest.approx(12 * 10e-6 + 192 / 25.6e9,
                                                                                         rel=1e-12)
    assert roofline(pcie="gen5").swap_time(3) == pytest.approx(12 * 10e-6 + 384 / 51.2e9, rel=1e-12)
    assert r.swap_time(0) == 0.0 and r.swap_time(-1) == 0.0


def test_copy_time_reads_and_writes_each_byte_once():
    """A block is 4 x 32 = 128 bytes (64 per GPU at TP 2); 3 blocks read and written at
    256 B/s: 3 s, plus 10 us for the launch. No block: 0."""
    assert roofline().copy_time(3) == pytest.approx(10e-6 + 3.0, rel=1e-12)
    assert roofline(tensor_parallel=2, interconnect=LINK).copy_time(3) == pytest.approx(10e-6 + 1.5, rel=1e-12)
    assert roofline().copy_time(0) == 0.0 and roofline().copy_time(-2) == 0.0


def test_presets_and_the_default_fit_per_gpu():
    """A GPU a profile measured gets its own fit (names in any case); any other the fit across
    profiles. An unknown preset's error lists every known one, sorted."""
    assert default_efficiencies("RTX4090") == "measured-rtx4090"
    assert default_efficiencies("a100-40gb") == "measured-a100"
    assert default_efficiencies("h100-sxm") == ACROSS_PROFILES == "measured-rtx4090-a100-rtx-pro-6000"
    assert roofline_preset("hand-picked") == {"compute_efficiency": 0.6, "memory_efficiency": 0.8,
                                              "step_overhead_s": 1e-3}
    with pytest.raises(ValueError) as e:
        roofline_preset("nope")
    assert str(e.value) == ("unknown roofline efficiencies 'nope'; known: "
                            + ", ".join(sorted(ROOFLINE_PRESETS)))
    assert RooflineParams() == RooflineParams(**ROOFLINE_PRESETS["measured-rtx4090"])
