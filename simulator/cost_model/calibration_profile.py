"""Calibration profiles: what ``kvsim calibrate`` measured on one GPU, as fitted formulas.

The one home of the format: ``gpu_validation`` writes it (importing this module, the arrow
DESIGN.md allows) and the ``calibrated`` cost model reads it. Plain Python + PyYAML only (no
torch, numpy, simpy or pydantic): the simulator reads profiles on machines without a GPU,
and the bench writes them on a GPU machine without the simulator's dependencies. A profile
is one YAML file::

    kvsim_profile: 1
    metadata:            # where and how it was measured
      gpu: NVIDIA H200   # torch.cuda.get_device_name()
      gpu_slug: nvidia-h200
      synthetic: false   # true: made from datasheet numbers, not measured
      date: '2025-01-01T00:00:00+00:00'
      hbm_peak_bytes_per_s: 4.8e12
      driver: ...  cuda: ...  torch: ...  triton: ...  num_sms: ...  dtype: float16
      notes: free text
    decode_attention:    # one launch = one layer, all sequences of the batch
      formula: seconds = a + b * kv_bytes + c * seq_heads
      shape: {num_kv_heads: 8, head_dim: 128, group: 4}   # what the bench ran
      paged:             # by block size (tokens)
        16: {a: 4.0e-06, b: 2.5e-13, c: 1.0e-09, rel_rmse: 0.03, points: 30}
      contiguous: {a: ..., b: ..., c: ...}
    prefill_attention:   # causal self-attention of a prefill batch, one layer
      formula: seconds = a + b * flops
      fit: {a: ..., b: ...}
    gemm:                # linear layers: y[m, n] = x[m, k] @ w[k, n], fp16/bf16
      formula: table (m -> seconds) per (n, k), linear interpolation; fallback roofline
      tables:
        - {n: 12288, k: 4096, m: [1, 8, ...], seconds: [...]}
      fallback: {a: ..., flops_per_s: ..., bytes_per_s: ...}
    block_copy:          # one launch copying blocks in all layers
      formula: seconds = a + b * bytes
      by_block_size: {16: {a: ..., b: ...}}
    swap:                # device <-> pinned host
      formula: seconds = latency_s * transfers + bytes / bytes_per_s
      per_block: {out: {latency_s: ..., bytes_per_s: ...}, in: {...},
                  gbps_by_block_size: {out: {16: 12.5}, in: {16: 13.0}}}
      batched:   {...same keys...}

Units: seconds, bytes, FLOPs. Quantities in the formulas:

- ``kv_bytes``: bytes of K and V the launch reads
  (``sum(context_lens) * 2 * num_kv_heads * head_dim * dtype_bytes``);
- ``seq_heads``: ``num_seqs * num_kv_heads``, the number of (sequence, KV head) programs;
- prefill ``flops``: ``4 * num_q_heads * head_dim * pairs`` (QK^T and PV), ``pairs`` the
  causal query-key pairs;
- GEMM ``flops = 2 m n k``; fallback bytes ``= (m k + k n + m n) * dtype_bytes``;
- block copy ``bytes``: bytes copied (each read once and written once);
- swap ``transfers``: per block mode ``2 * layers * blocks`` (K and V separately, as vLLM
  v0 issues them); batched mode ``layers`` (one gathered run per layer).
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from kvsim.simulator.cost_model.yaml_reader import YamlReader

PROFILE_VERSION = 1

DECODE_FORMULA = "seconds = a + b * kv_bytes + c * seq_heads"
PREFILL_FORMULA = "seconds = a + b * flops"
GEMM_FORMULA = (
    "table (m -> seconds) per (n, k), linear in m between points, proportional to m beyond "
    "the last; other shapes: a + max(flops / flops_per_s, bytes / bytes_per_s)"
)
COPY_FORMULA = "seconds = a + b * bytes"
SWAP_FORMULA = "seconds = latency_s * transfers + bytes / bytes_per_s"


# libyaml's safe loader/dumper when PyYAML was built with it (10x faster), else pure Python
_Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_Dumper = getattr(yaml, "CSafeDumper", yaml.SafeDumper)


class ProfileError(ValueError):
    """A profile file is missing a key or holds a value of the wrong kind."""


# --- fitted formulas ---------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class FitQuality:
    """How well a fitted formula matches the points it was fitted on; every fit carries it.

    Keyword-only, so that each fit's own coefficients stay its positional arguments
    (``AffineFit(a, b, rel_rmse=..., points=...)``); both default to "not fitted"
    (a synthetic profile's formulas).
    """

    rel_rmse: float = 0.0  # root mean square relative error of the fit on its points
    points: int = 0  # measurements the fit used

    def quality_dict(self) -> dict[str, float | int]:
        """The quality fields as the profile file writes them, after the coefficients."""
        return {"rel_rmse": self.rel_rmse, "points": self.points}


@dataclass(frozen=True)
class DecodeFit(FitQuality):
    """``seconds = a + b * kv_bytes + c * seq_heads`` for one decode-attention launch."""

    a: float
    b: float
    c: float

    def seconds(self, kv_bytes: float, seq_heads: float) -> float:
        return self.a + self.b * kv_bytes + self.c * seq_heads


@dataclass(frozen=True)
class AffineFit(FitQuality):
    """``seconds = a + b * x`` (x: FLOPs for prefill attention, bytes for block copy)."""

    a: float
    b: float

    def seconds(self, x: float) -> float:
        return self.a + self.b * x


@dataclass(frozen=True)
class TransferFit(FitQuality):
    """``seconds = latency_s * transfers + bytes / bytes_per_s`` (host link, one direction)."""

    latency_s: float
    bytes_per_s: float

    def seconds(self, transfers: float, nbytes: float) -> float:
        return self.latency_s * transfers + nbytes / self.bytes_per_s


@dataclass(frozen=True)
class GemmTable:
    """Measured seconds of ``[m, k] @ [k, n]`` at increasing token counts ``m``."""

    n: int
    k: int
    m: tuple[int, ...]
    seconds: tuple[float, ...]

    def seconds_at(self, m: float) -> float:
        """Linear between measured points; below the first, the first; beyond the last,
        proportional to ``m`` (large GEMMs are compute-bound)."""
        ms, ts = self.m, self.seconds
        if m <= ms[0]:
            return ts[0]
        if m >= ms[-1]:
            return ts[-1] * m / ms[-1]
        i = bisect.bisect_right(ms, m)
        m0, m1, t0, t1 = ms[i - 1], ms[i], ts[i - 1], ts[i]
        return t0 + (t1 - t0) * (m - m0) / (m1 - m0)


@dataclass(frozen=True)
class GemmRoofline:
    """Fallback for shapes without a table: ``a + max(flops / flops_per_s, bytes / bytes_per_s)``."""

    a: float
    flops_per_s: float
    bytes_per_s: float

    def seconds(self, m: float, n: int, k: int, dtype_bytes: int = 2) -> float:
        flops = 2.0 * m * n * k
        nbytes = (m * k + k * n + m * n) * dtype_bytes
        return self.a + max(flops / self.flops_per_s, nbytes / self.bytes_per_s)


@dataclass(frozen=True)
class SwapMode:
    """One swap mode: a fit per direction and the measured GB/s by block size."""

    out: TransferFit  # device -> host
    into: TransferFit  # host -> device ("in" in the file)
    gbps_out: dict[int, float] = field(default_factory=dict)  # block size -> 1e9 bytes/s
    gbps_in: dict[int, float] = field(default_factory=dict)


@dataclass(frozen=True)
class ProfileMetadata:
    gpu: str
    date: str  # ISO 8601
    synthetic: bool  # True: made from published specs, not measured
    hbm_peak_bytes_per_s: float
    gpu_slug: str = ""
    driver: str = ""
    cuda: str = ""
    torch: str = ""
    triton: str = ""
    num_sms: int = 0
    dtype: str = "float16"
    notes: str = ""


@dataclass(frozen=True)
class Profile:
    metadata: ProfileMetadata
    decode_shape: dict[str, int]  # num_kv_heads, head_dim, group the bench ran
    decode_paged: dict[int, DecodeFit]  # block size -> fit
    decode_contiguous: DecodeFit
    prefill: AffineFit
    gemm_tables: dict[tuple[int, int], GemmTable]  # (n, k) -> table
    gemm_fallback: GemmRoofline
    block_copy: dict[int, AffineFit]  # block size -> fit
    swap_per_block: SwapMode
    swap_batched: SwapMode
    source: str = field(default="", compare=False)  # the file it was read from, for errors

    # --- lookups -------------------------------------------------------------------
    def decode_fit(self, kernel: str, block_size: int) -> DecodeFit:
        if kernel == "contiguous":
            return self.decode_contiguous
        if kernel != "paged":
            raise ProfileError(f"kernel must be 'paged' or 'contiguous', got {kernel!r}")
        try:
            return self.decode_paged[block_size]
        except KeyError:
            raise ProfileError(
                f"{self.source or 'profile'}: decode_attention.paged has no block size "
                f"{block_size}; measured: {sorted(self.decode_paged)}"
            ) from None

    def copy_fit(self, block_size: int) -> AffineFit:
        try:
            return self.block_copy[block_size]
        except KeyError:
            raise ProfileError(
                f"{self.source or 'profile'}: block_copy.by_block_size has no block size "
                f"{block_size}; measured: {sorted(self.block_copy)}"
            ) from None

    def gemm_seconds(self, m: float, n: int, k: int, dtype_bytes: int = 2) -> float:
        """Seconds of one ``[m, k] @ [k, n]``: the measured table if there is one."""
        if m <= 0:
            return 0.0
        table = self.gemm_tables.get((n, k))
        if table is not None:
            return table.seconds_at(m)
        return self.gemm_fallback.seconds(m, n, k, dtype_bytes)

    def swap_mode(self, batched: bool) -> SwapMode:
        return self.swap_batched if batched else self.swap_per_block

    # --- (de)serialisation -------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        md = self.metadata

        def decode(f: DecodeFit) -> dict:
            return {"a": f.a, "b": f.b, "c": f.c, **f.quality_dict()}

        def affine(f: AffineFit) -> dict:
            return {"a": f.a, "b": f.b, **f.quality_dict()}

        def transfer(f: TransferFit) -> dict:
            return {"latency_s": f.latency_s, "bytes_per_s": f.bytes_per_s, **f.quality_dict()}

        def swap(s: SwapMode) -> dict:
            return {
                "out": transfer(s.out),
                "in": transfer(s.into),
                "gbps_by_block_size": {"out": dict(s.gbps_out), "in": dict(s.gbps_in)},
            }

        return {
            "kvsim_profile": PROFILE_VERSION,
            "metadata": {
                "gpu": str(md.gpu),
                "gpu_slug": str(md.gpu_slug),
                "synthetic": bool(md.synthetic),
                "date": str(md.date),
                "hbm_peak_bytes_per_s": float(md.hbm_peak_bytes_per_s),
                "driver": str(md.driver),
                "cuda": str(md.cuda),
                "torch": str(md.torch),
                "triton": str(md.triton),
                "num_sms": int(md.num_sms),
                "dtype": str(md.dtype),
                "notes": str(md.notes),
            },
            "decode_attention": {
                "formula": DECODE_FORMULA,
                "shape": dict(self.decode_shape),
                "paged": {bs: decode(f) for bs, f in sorted(self.decode_paged.items())},
                "contiguous": decode(self.decode_contiguous),
            },
            "prefill_attention": {"formula": PREFILL_FORMULA, "fit": affine(self.prefill)},
            "gemm": {
                "formula": GEMM_FORMULA,
                "tables": [
                    {"n": t.n, "k": t.k, "m": list(t.m), "seconds": list(t.seconds)}
                    for _, t in sorted(self.gemm_tables.items())
                ],
                "fallback": {
                    "a": self.gemm_fallback.a,
                    "flops_per_s": self.gemm_fallback.flops_per_s,
                    "bytes_per_s": self.gemm_fallback.bytes_per_s,
                },
            },
            "block_copy": {
                "formula": COPY_FORMULA,
                "by_block_size": {bs: affine(f) for bs, f in sorted(self.block_copy.items())},
            },
            "swap": {
                "formula": SWAP_FORMULA,
                "per_block": swap(self.swap_per_block),
                "batched": swap(self.swap_batched),
            },
        }

    @classmethod
    def from_dict(cls, data: Any, source: str = "profile") -> Profile:
        return _Reader(source).profile(data)


def write_profile(profile: Profile, path: str | Path) -> Path:
    """Write ``profile`` as YAML; returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as f:
        yaml.dump(
            profile.to_dict(),
            f,
            Dumper=_Dumper,
            sort_keys=False,
            default_flow_style=None,
            width=100,
        )
    return path


def read_profile(path: str | Path) -> Profile:
    """Read and validate a profile; errors name the file and the key."""
    path = Path(path)
    if not path.is_file():
        raise ProfileError(f"{path}: no such profile file")
    with path.open() as f:
        try:
            data = yaml.load(f, Loader=_Loader)
        except yaml.YAMLError as e:
            raise ProfileError(f"{path}: not valid YAML ({e})") from None
    return Profile.from_dict(data, source=str(path))


# --- validation ----------------------------------------------------------------------------
class _Reader(YamlReader):
    """Pulls typed values out of the parsed YAML, naming ``file: key.path`` on any error."""

    error = ProfileError

    def number(
        self, d: dict, name: str, key: str, *, minimum: float = 0.0, positive=False
    ) -> float:
        v = self.get(d, name, key)
        path = f"{key}.{name}"
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise self.fail(path, f"expected a finite number, got {v!r}")
        if positive and v <= 0:
            raise self.fail(path, f"expected a number > 0, got {v!r}")
        if v < minimum:
            raise self.fail(path, f"expected a number >= {minimum}, got {v!r}")
        return float(v)

    def integer(self, d: dict, name: str, key: str) -> int:
        v = self.get(d, name, key)
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise self.fail(f"{key}.{name}", f"expected an integer >= 0, got {v!r}")
        return v

    def string(self, d: dict, name: str, key: str, default: str | None = None) -> str:
        if name not in d and default is not None:
            return default
        v = self.get(d, name, key)
        if v is None and default is not None:
            return default
        return str(v)

    def block_sizes(self, d: Any, key: str) -> dict[int, Any]:
        d = self.mapping(d, key)
        if not d:
            raise self.fail(key, "expected at least one block size")
        out = {}
        for bs, v in d.items():
            if isinstance(bs, bool) or not isinstance(bs, int) or bs < 1:
                raise self.fail(f"{key}.{bs}", "block sizes must be integers >= 1")
            out[bs] = v
        return out

    def quality(self, d: dict, key: str) -> dict[str, Any]:
        """A fit's optional ``FitQuality`` fields, as keywords (absent: the defaults)."""
        quality: dict[str, Any] = {}
        if "rel_rmse" in d:
            quality["rel_rmse"] = self.number(d, "rel_rmse", key)
        if "points" in d:
            quality["points"] = self.integer(d, "points", key)
        return quality

    def decode(self, d: Any, key: str) -> DecodeFit:
        d = self.mapping(d, key)
        return DecodeFit(
            self.number(d, "a", key),
            self.number(d, "b", key),
            self.number(d, "c", key),
            **self.quality(d, key),
        )

    def affine(self, d: Any, key: str) -> AffineFit:
        d = self.mapping(d, key)
        return AffineFit(
            self.number(d, "a", key),
            self.number(d, "b", key),
            **self.quality(d, key),
        )

    def transfer(self, d: Any, key: str) -> TransferFit:
        d = self.mapping(d, key)
        return TransferFit(
            self.number(d, "latency_s", key),
            self.number(d, "bytes_per_s", key, positive=True),
            **self.quality(d, key),
        )

    def gbps(self, d: Any, key: str) -> dict[int, float]:
        if d is None:
            return {}
        d = self.block_sizes(d, key)
        return {bs: self.number({bs: v}, bs, key, positive=True) for bs, v in d.items()}

    def swap(self, d: Any, key: str) -> SwapMode:
        d = self.mapping(d, key)
        gb = self.mapping(d.get("gbps_by_block_size", {}) or {}, f"{key}.gbps_by_block_size")
        return SwapMode(
            out=self.transfer(self.get(d, "out", key), f"{key}.out"),
            into=self.transfer(self.get(d, "in", key), f"{key}.in"),
            gbps_out=self.gbps(gb.get("out"), f"{key}.gbps_by_block_size.out"),
            gbps_in=self.gbps(gb.get("in"), f"{key}.gbps_by_block_size.in"),
        )

    def gemm_table(self, d: Any, key: str) -> GemmTable:
        d = self.mapping(d, key)
        n, k = self.integer(d, "n", key), self.integer(d, "k", key)
        ms, ts = self.get(d, "m", key), self.get(d, "seconds", key)
        if not isinstance(ms, list) or not isinstance(ts, list) or len(ms) != len(ts) or not ms:
            raise self.fail(key, "m and seconds must be non-empty lists of equal length")
        m = tuple(self.integer({"m": x}, "m", key) for x in ms)
        if any(b <= a for a, b in zip(m, m[1:])) or m[0] < 1:
            raise self.fail(f"{key}.m", f"must be increasing integers >= 1, got {list(m)}")
        t = tuple(self.number({"seconds": x}, "seconds", key, positive=True) for x in ts)
        return GemmTable(n, k, m, t)

    def profile(self, data: Any) -> Profile:
        top = self.mapping(data, "(top level)")
        version = top.get("kvsim_profile")
        if version != PROFILE_VERSION:
            raise self.fail("kvsim_profile", f"expected {PROFILE_VERSION}, got {version!r}")
        md = self.mapping(self.get(top, "metadata", ""), "metadata")
        synthetic = self.get(md, "synthetic", "metadata")
        if not isinstance(synthetic, bool):
            raise self.fail("metadata.synthetic", f"expected true or false, got {synthetic!r}")
        metadata = ProfileMetadata(
            gpu=self.string(md, "gpu", "metadata"),
            date=self.string(md, "date", "metadata"),
            synthetic=synthetic,
            hbm_peak_bytes_per_s=self.number(md, "hbm_peak_bytes_per_s", "metadata", positive=True),
            gpu_slug=self.string(md, "gpu_slug", "metadata", ""),
            driver=self.string(md, "driver", "metadata", ""),
            cuda=self.string(md, "cuda", "metadata", ""),
            torch=self.string(md, "torch", "metadata", ""),
            triton=self.string(md, "triton", "metadata", ""),
            num_sms=self.integer(md, "num_sms", "metadata") if "num_sms" in md else 0,
            dtype=self.string(md, "dtype", "metadata", "float16"),
            notes=self.string(md, "notes", "metadata", ""),
        )
        da = self.mapping(self.get(top, "decode_attention", ""), "decode_attention")
        shape = self.mapping(da.get("shape", {}) or {}, "decode_attention.shape")
        decode_shape = {k: self.integer(shape, k, "decode_attention.shape") for k in shape}
        paged = self.block_sizes(
            self.get(da, "paged", "decode_attention"), "decode_attention.paged"
        )
        decode_paged = {
            bs: self.decode(v, f"decode_attention.paged.{bs}") for bs, v in paged.items()
        }
        contiguous = self.decode(
            self.get(da, "contiguous", "decode_attention"), "decode_attention.contiguous"
        )

        pa = self.mapping(self.get(top, "prefill_attention", ""), "prefill_attention")
        prefill = self.affine(self.get(pa, "fit", "prefill_attention"), "prefill_attention.fit")

        gm = self.mapping(self.get(top, "gemm", ""), "gemm")
        tables_raw = self.get(gm, "tables", "gemm")
        if not isinstance(tables_raw, list):
            raise self.fail("gemm.tables", "expected a list")
        tables = {}
        for i, t in enumerate(tables_raw):
            table = self.gemm_table(t, f"gemm.tables[{i}]")
            tables[(table.n, table.k)] = table
        fb = self.mapping(self.get(gm, "fallback", "gemm"), "gemm.fallback")
        fallback = GemmRoofline(
            self.number(fb, "a", "gemm.fallback"),
            self.number(fb, "flops_per_s", "gemm.fallback", positive=True),
            self.number(fb, "bytes_per_s", "gemm.fallback", positive=True),
        )

        bc = self.mapping(self.get(top, "block_copy", ""), "block_copy")
        by_bs = self.block_sizes(
            self.get(bc, "by_block_size", "block_copy"), "block_copy.by_block_size"
        )
        block_copy = {
            bs: self.affine(v, f"block_copy.by_block_size.{bs}") for bs, v in by_bs.items()
        }

        sw = self.mapping(self.get(top, "swap", ""), "swap")
        return Profile(
            metadata=metadata,
            decode_shape=decode_shape,
            decode_paged=decode_paged,
            decode_contiguous=contiguous,
            prefill=prefill,
            gemm_tables=tables,
            gemm_fallback=fallback,
            block_copy=block_copy,
            swap_per_block=self.swap(self.get(sw, "per_block", "swap"), "swap.per_block"),
            swap_batched=self.swap(self.get(sw, "batched", "swap"), "swap.batched"),
            source=self.source,
        )
