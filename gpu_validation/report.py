"""The headline numbers of a calibration run, computed from its raw rows (no torch).

- achieved decode bandwidth as a share of HBM peak (paged and contiguous, per block size),
  over the points with batch >= 64 and context >= 2048;
- paged / contiguous time ratio per block size over the same points;
- swap GB/s per block size, per mode and direction.

Targets (issue #8): paged decode reaches >= 70% of HBM peak, and at block size 16 the paged
kernel is within 15% of the contiguous one (the PagedAttention paper measured its kernel
20-26% slower than FasterTransformer's; Kwon et al. 2023, Sec. 7.1).
"""

from __future__ import annotations

import statistics
from collections import defaultdict

BANDWIDTH_TARGET = 0.70  # share of HBM peak
RATIO_TARGET = 1.15  # paged / contiguous at block size 16
TARGET_BATCH = 64  # target points: batch >= this ...
TARGET_CONTEXT = 2048  # ... and context >= this

# Datasheet HBM peaks (bytes/s), matched against torch.cuda.get_device_name(), most
# specific first. NVIDIA H200 / H100 / A100 datasheets.
HBM_PEAKS = (
    (("h200",), 4.8e12),
    (("gh200",), 4.0e12),
    (("h100", "nvl"), 3.9e12),
    (("h100", "pcie"), 2.0e12),
    (("h100",), 3.35e12),
    (("a100", "80gb", "pcie"), 1.935e12),
    (("a100", "80gb"), 2.039e12),
    (("a100",), 1.555e12),
    (("l40s",), 864e9),
)


def hbm_peak_from_name(name: str) -> float | None:
    lower = name.lower()
    for words, peak in HBM_PEAKS:
        if all(w in lower for w in words):
            return peak
    return None


def _is_target(r: dict) -> bool:
    return r["batch"] >= TARGET_BATCH and r["context"] >= TARGET_CONTEXT


def summarize(rows: list[dict], hbm_peak: float | None) -> dict:
    """The reported numbers as a JSON-able dict (block sizes as int keys)."""
    decode = [r for r in rows if r["section"] == "decode" and _is_target(r)]
    bw: dict[str, dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
    times: dict[tuple[int, int], dict[tuple[str, int], float]] = defaultdict(dict)
    for r in decode:
        bw[r["kernel"]][int(r["block_size"])].append(r["kv_bytes"] / r["seconds"])
        times[(r["batch"], r["context"])][(r["kernel"], int(r["block_size"]))] = r["seconds"]
    achieved = {k: {bs: statistics.median(v) for bs, v in sorted(d.items())} for k, d in bw.items()}
    share = (
        {k: {bs: v / hbm_peak for bs, v in d.items()} for k, d in achieved.items()}
        if hbm_peak
        else {}
    )
    ratios: dict[int, list[float]] = defaultdict(list)
    for point in times.values():
        contiguous = point.get(("contiguous", 0))
        if contiguous is None:
            continue
        for (kernel, bs), t in point.items():
            if kernel == "paged":
                ratios[bs].append(t / contiguous)
    ratio = {bs: statistics.median(v) for bs, v in sorted(ratios.items())}

    swap: dict[str, dict[str, dict[int, float]]] = defaultdict(lambda: defaultdict(dict))
    largest: dict[tuple[str, str, int], dict] = {}
    for r in rows:
        if r["section"] == "swap":
            key = (r["mode"], r["direction"], int(r["block_size"]))
            if key not in largest or r["bytes"] > largest[key]["bytes"]:
                largest[key] = r
    for (mode, direction, bs), r in sorted(largest.items()):
        swap[mode][direction][bs] = r["bytes"] / r["seconds"] / 1e9

    memcpy = [r["bytes"] / r["seconds"] for r in rows if r["section"] == "memcpy"]
    split = {r["kernel"]: r["seconds"] for r in rows if r["section"] == "split_kv"}
    out = {
        "target_points": f"batch >= {TARGET_BATCH}, context >= {TARGET_CONTEXT}",
        "hbm_peak_bytes_per_s": hbm_peak,
        "decode_bytes_per_s": achieved,
        "decode_share_of_hbm_peak": share,
        "paged_over_contiguous": ratio,
        "swap_gbps": {m: dict(d) for m, d in swap.items()},
        "memcpy_share_of_hbm_peak": (max(memcpy) / hbm_peak) if (memcpy and hbm_peak) else None,
        "split_kv_speedup": (split["single_pass"] / split["split_kv"]) if len(split) == 2 else None,
    }
    paged_share_16 = share.get("paged", {}).get(16)
    out["targets"] = {
        "paged_bs16_share_of_hbm_peak >= 0.70": None
        if paged_share_16 is None
        else paged_share_16 >= BANDWIDTH_TARGET,
        "paged_over_contiguous_bs16 <= 1.15": None
        if 16 not in ratio
        else ratio[16] <= RATIO_TARGET,
    }
    return out


def format_summary(s: dict) -> str:
    """Human-readable lines for the console."""
    lines = [f"Decode at {s['target_points']} (medians):"]
    share = s["decode_share_of_hbm_peak"]
    peak = s["hbm_peak_bytes_per_s"]
    lines.append(
        f"  HBM peak {peak / 1e12:.2f} TB/s" if peak else "  HBM peak unknown for this GPU"
    )
    for kernel, by_bs in s["decode_bytes_per_s"].items():
        for bs, v in by_bs.items():
            label = f"{kernel} bs={bs}" if kernel == "paged" else kernel
            pct = f" = {100 * share[kernel][bs]:.1f}% of HBM peak" if share else ""
            lines.append(f"  {label:<16} {v / 1e12:.3f} TB/s{pct}")
    if s.get("memcpy_share_of_hbm_peak") is not None:
        lines.append(
            f"  (device memcpy reaches {100 * s['memcpy_share_of_hbm_peak']:.1f}% of peak)"
        )
    lines.append("Paged / contiguous decode time, by block size:")
    lines.append("  " + "  ".join(f"{bs}: {r:.3f}" for bs, r in s["paged_over_contiguous"].items()))
    if s.get("split_kv_speedup") is not None:
        lines.append(
            f"Split-KV speedup at 1 sequence, longest context: {s['split_kv_speedup']:.2f}x"
        )
    lines.append("Swap GB/s by block size (largest transfer timed):")
    for mode, by_dir in s["swap_gbps"].items():
        for direction, by_bs in by_dir.items():
            vals = "  ".join(f"{bs}: {v:.2f}" for bs, v in by_bs.items())
            lines.append(f"  {mode:<9} {direction:<3} {vals}")
    lines.append("Targets:")
    for name, ok in s["targets"].items():
        lines.append(f"  {name}: {'n/a' if ok is None else ('PASS' if ok else 'FAIL')}")
    return "\n".join(lines)
