"""A synthetic profile made from datasheet numbers, for trying ``calibrated`` without a GPU.

``python -m kvsim.gpu_validation.synthetic_profile`` writes ``profiles/example-a100-80gb.yaml``.
Nothing in it is measured: every formula is a roofline of the A100-80GB's published
peaks (NVIDIA A100 datasheet: 2.039 TB/s HBM2e, 312 TFLOP/s dense fp16 tensor core, PCIe
4.0 x16 host link) times an assumed achieved efficiency, written in the same format a
real calibration writes. Its metadata says ``synthetic: true``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from kvsim.gpu_validation.fitting import gemm_table, reported_gbps, sig
from kvsim.simulator.cost_model.calibration_profile import (
    AffineFit,
    DecodeFit,
    GemmRoofline,
    Profile,
    ProfileMetadata,
    SwapMode,
    TransferFit,
    write_profile,
)
from kvsim.simulator.cost_model.gemm_shapes import catalogue_gemms

BLOCK_SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256)
GEMM_MS = (1, 8, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192)


@dataclass(frozen=True)
class SyntheticSpec:
    """Published peaks and the assumed share of them each part achieves."""

    gpu: str = "NVIDIA A100-SXM4-80GB"
    slug: str = "example-a100-80gb"
    hbm_bytes_per_s: float = 2.039e12  # datasheet
    tensor_flops: float = 312e12  # dense fp16/bf16, datasheet
    host_bytes_per_s: float = 25.6e9  # PCIe 4.0 x16: 32 GB/s theoretical, ~80% with pinned memory
    num_sms: int = 108
    launch_s: float = 5e-6  # one kernel launch
    transfer_latency_s: float = 10e-6  # one cudaMemcpyAsync (launch + DMA setup)
    decode_efficiency: float = 0.80  # contiguous decode attention: share of HBM peak
    # paged / contiguous decode = paged_base + paged_per_block / block_size; 1.23 at block 16,
    # inside the 20-26% the PagedAttention paper measured (Kwon et al. 2023, Fig. 18a)
    paged_base: float = 1.15
    paged_per_block: float = 1.3
    per_program_s: float = 5e-9  # fixed cost per (sequence, KV head) program
    prefill_efficiency: float = 0.60  # flash attention forward: share of tensor peak
    gemm_compute_efficiency: float = 0.70
    gemm_memory_efficiency: float = 0.85
    copy_efficiency: float = 0.80  # block copy: share of HBM peak (each byte read + written)
    pool_layers: int = 4  # the pool shape the reported swap GB/s refer to (as the bench)
    kv_bytes_per_token_layer: int = 2 * 8 * 128 * 2  # K+V, 8 KV heads of 128, fp16
    swap_bytes: int = 64 << 20


def synthetic_profile(spec: SyntheticSpec = SyntheticSpec()) -> Profile:
    contiguous_b = 1.0 / (spec.decode_efficiency * spec.hbm_bytes_per_s)
    decode_paged = {
        bs: DecodeFit(
            spec.launch_s,
            sig(contiguous_b * (spec.paged_base + spec.paged_per_block / bs)),
            spec.per_program_s,
        )
        for bs in BLOCK_SIZES
    }
    gemm = GemmRoofline(
        spec.launch_s,
        spec.gemm_compute_efficiency * spec.tensor_flops,
        spec.gemm_memory_efficiency * spec.hbm_bytes_per_s,
    )
    tables = {
        (n, k): gemm_table(n, k, {m: gemm.seconds(m, n, k) for m in GEMM_MS})
        for n, k in catalogue_gemms()
    }
    copy = AffineFit(spec.launch_s, sig(2.0 / (spec.copy_efficiency * spec.hbm_bytes_per_s)))
    link = TransferFit(spec.transfer_latency_s, spec.host_bytes_per_s)

    def gbps(per_block: bool) -> dict[int, float]:
        out = {}
        for bs in BLOCK_SIZES:
            block_bytes = bs * spec.kv_bytes_per_token_layer * spec.pool_layers
            blocks = max(1, spec.swap_bytes // block_bytes)
            transfers = 2 * spec.pool_layers * blocks if per_block else spec.pool_layers
            nbytes = blocks * block_bytes
            out[bs] = reported_gbps(nbytes, link.seconds(transfers, nbytes))
        return out

    per_block, batched = gbps(True), gbps(False)
    metadata = ProfileMetadata(
        gpu=spec.gpu,
        date="2025-01-01T00:00:00+00:00",
        synthetic=True,
        hbm_peak_bytes_per_s=spec.hbm_bytes_per_s,
        gpu_slug=spec.slug,
        num_sms=spec.num_sms,
        dtype="float16",
        notes=(
            "SYNTHETIC, NOT MEASURED: made by gpu_validation/synthetic_profile.py from the "
            "A100-80GB datasheet (2.039 TB/s HBM, 312 TFLOP/s fp16, PCIe 4.0 x16) and assumed "
            "efficiencies, so the calibrated cost model can be tried without a GPU."
        ),
    )
    return Profile(
        metadata=metadata,
        decode_shape={"num_kv_heads": 8, "head_dim": 128, "group": 4},
        decode_paged=decode_paged,
        decode_contiguous=DecodeFit(spec.launch_s, sig(contiguous_b), spec.per_program_s),
        prefill=AffineFit(spec.launch_s, sig(1.0 / (spec.prefill_efficiency * spec.tensor_flops))),
        gemm_tables=tables,
        gemm_fallback=GemmRoofline(gemm.a, sig(gemm.flops_per_s), sig(gemm.bytes_per_s)),
        block_copy=dict.fromkeys(BLOCK_SIZES, copy),
        swap_per_block=SwapMode(link, link, per_block, per_block),
        swap_batched=SwapMode(link, link, batched, batched),
    )


EXAMPLE_PATH = Path(__file__).parent / "profiles" / "example-a100-80gb.yaml"

if __name__ == "__main__":
    print(f"wrote {write_profile(synthetic_profile(), EXAMPLE_PATH)}")
