"""Operator profiles: measured operator times of one model on one GPU, as lookup tables.

The ``profiled`` cost model reads them; ``kvsim calibrate --import DIR`` writes them from
a public profile bundle (``simulator.cost_model.profile_import``). Plain Python + PyYAML (no
numpy, simpy or pydantic), so ``gpu_validation`` can write the format without the simulator.
One YAML file per profile::

    kvsim_operator_profile: 1
    provenance:            # where the numbers come from (all strings)
      source: ...          # upstream repository, path and commit
      gpu: NVIDIA GeForce RTX 4090
      engine: vLLM 0.19.0
      date: '2026-08-17T19:43:32+00:00'
      licence: MIT ...     # and the LICENSE / attribution files shipped beside the profile
    model: {name: meta-llama/Llama-3.1-8B, variant: bf16, architecture: llama,
            num_heads: 32, num_kv_heads: 8, ffn_size: 14336, vocab_size: 128256}
    operators:             # how a step is assembled from the tables
      per_layer: {layernorm: 2, qkv_proj: 1, ...}   # dense operators, times per decoder layer
      per_step: [embedding, final_layernorm]        # dense operators run once per step
      tp_stable: [layernorm, final_layernorm, sampler]  # not sharded by tensor parallelism
    tp:                    # one entry per measured tensor-parallel degree (per-GPU times)
      1:
        dense:             # by tokens in the step
          qkv_proj: {tokens: [1, 2, ...], time_us: [20.4, ...]}
        per_sequence:      # once per step, by sequences sampled
          lm_head: {sequences: [1, 2, ...], time_us: [...]}
        attention:         # one layer's attention on a 4-D grid, C order, null = not measured
          prefill_chunk: [0, 16, ..., 2048]   # new prompt tokens of the prefill chunk
          kv_prefill: [0, 16, ..., 16384]     # tokens cached before the chunk
          n_decode: [0, 1, ..., 256]          # decoding sequences
          kv_decode: [0, 16, ..., 16384]      # tokens each decoding sequence holds
          time_us: [null, 9.31, ...]
        moe:               # mixture-of-experts models only: one MoE block (router + experts),
          tokens: [1, 2, ..., 2048]           # C order, null = not measured (simulator.cost_model.moe)
          activated_experts: [8, 16, ..., 128]
          time_us: [50.2, null, ...]

Times are microseconds in the file (as measured) and seconds once read.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from kvsim.simulator.cost_model import profile_cache
from kvsim.simulator.cost_model.moe import MoeGrid
from kvsim.simulator.cost_model.yaml_reader import YamlReader

FORMAT_VERSION = 1
ATTENTION_AXES = ("prefill_chunk", "kv_prefill", "n_decode", "kv_decode")
PROVENANCE_KEYS = ("source", "gpu", "engine", "date", "licence")
MODEL_SHAPE_KEYS = ("num_heads", "num_kv_heads", "ffn_size", "vocab_size")
#: shipped profiles: ``gpu_validation/profiles`` (a data folder, read as files, never imported)
PROFILES_DIR = Path(__file__).resolve().parents[2] / "gpu_validation" / "profiles"

_Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_Dumper = getattr(yaml, "CSafeDumper", yaml.SafeDumper)


class OperatorProfileError(ValueError):
    """An operator profile is missing, unreadable or malformed (one line: file and key)."""


@dataclass(frozen=True)
class Table1D:
    """Measured seconds at increasing values of one quantity (tokens or sequences)."""

    x: tuple[int, ...]
    seconds: tuple[float, ...]


@dataclass(frozen=True)
class AttentionGrid:
    """One layer's attention time (s) on the product of the four axes; None = not measured."""

    prefill_chunk: tuple[int, ...]
    kv_prefill: tuple[int, ...]
    n_decode: tuple[int, ...]
    kv_decode: tuple[int, ...]
    seconds: tuple[float | None, ...]  # C order over (prefill_chunk, kv_prefill, n_decode, kv_decode)

    def at(self, i: int, j: int, k: int, m: int) -> float | None:
        """Seconds at axis indices ``(i, j, k, m)``."""
        nj, nk, nm = len(self.kv_prefill), len(self.n_decode), len(self.kv_decode)
        return self.seconds[((i * nj + j) * nk + k) * nm + m]

    def points(self) -> list[tuple[int, int, int, int, float]]:
        """Every measured point as ``(prefill_chunk, kv_prefill, n_decode, kv_decode, s)``."""
        out = []
        for i, pc in enumerate(self.prefill_chunk):
            for j, kp in enumerate(self.kv_prefill):
                for k, nd in enumerate(self.n_decode):
                    for m, kd in enumerate(self.kv_decode):
                        t = self.at(i, j, k, m)
                        if t is not None:
                            out.append((pc, kp, nd, kd, t))
        return out


@dataclass(frozen=True)
class TPTables:
    """Per-GPU operator tables measured at one tensor-parallel degree."""

    dense: dict[str, Table1D]
    per_sequence: dict[str, Table1D]
    attention: AttentionGrid
    moe: MoeGrid | None = None  # one MoE block by tokens x activated experts (MoE models)


@dataclass(frozen=True)
class OperatorProfile:
    name: str
    provenance: dict[str, str]
    model: dict[str, Any]  # name, variant, architecture and the shapes measured (TP 1)
    per_layer: dict[str, int]  # dense operator -> times it runs per decoder layer
    per_step: tuple[str, ...]  # dense operators run once per step
    tp_stable: tuple[str, ...]  # operators whose time does not shrink with tensor parallelism
    tp: dict[int, TPTables]
    source: str = field(default="", compare=False)  # file read from, for messages

    @property
    def times_lm_head(self) -> bool:
        """Whether the profile measured the LM head (Vidur's do not): a roofline compared with
        a profile that did not leaves it out too (``RooflineParams.lm_head``)."""
        return "lm_head" in self.tp[min(self.tp)].per_sequence

    def to_dict(self) -> dict:
        def us(seconds):
            return [None if s is None else round(s * 1e6, 6) for s in seconds]

        tp = {}
        for degree, t in sorted(self.tp.items()):
            a = t.attention
            tp[degree] = {
                "dense": {k: {"tokens": list(v.x), "time_us": us(v.seconds)} for k, v in t.dense.items()},
                "per_sequence": {
                    k: {"sequences": list(v.x), "time_us": us(v.seconds)}
                    for k, v in t.per_sequence.items()
                },
                "attention": {**{ax: list(getattr(a, ax)) for ax in ATTENTION_AXES},
                              "time_us": us(a.seconds)},
            }
            if t.moe is not None:
                tp[degree]["moe"] = {"tokens": list(t.moe.tokens), "activated_experts": list(t.moe.activated_experts),
                                     "time_us": us(t.moe.seconds)}
        return {
            "kvsim_operator_profile": FORMAT_VERSION,
            "name": self.name,
            "provenance": dict(self.provenance),
            "model": dict(self.model),
            "operators": {"per_layer": dict(self.per_layer), "per_step": list(self.per_step),
                          "tp_stable": list(self.tp_stable)},
            "tp": tp,
        }


def write_operator_profile(profile: OperatorProfile, path: str | Path) -> Path:
    """Write ``profile`` as YAML (tables in flow style, one line each); returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    text = yaml.dump(profile.to_dict(), Dumper=_Dumper, sort_keys=False, default_flow_style=None,
                     width=1 << 30)
    path.write_text(text)
    return path


def is_operator_profile(path: str | Path) -> bool:
    """Whether a YAML file starts as an operator profile (without parsing it all)."""
    try:
        with Path(path).open() as f:
            return f.readline().startswith("kvsim_operator_profile:")
    except OSError:
        return False


_CACHE: dict[tuple[str, float], OperatorProfile] = {}


def read_operator_profile(path: str | Path) -> OperatorProfile:
    """Read and check a profile (cached by path and modification time: replicas and sweep
    points share one copy); errors name the file and the key. A large profile is parsed once
    and then read from a binary copy keyed by its bytes' hash (``profile_cache``: where the
    copy is kept, and when it is not)."""
    path = Path(path)
    try:
        key = (str(path.resolve()), path.stat().st_mtime)
    except OSError:
        raise OperatorProfileError(f"{path}: no such operator profile") from None
    if key not in _CACHE:
        try:
            raw = path.read_bytes()
        except OSError as e:
            raise OperatorProfileError(f"{path}: cannot read ({e.strerror or e})") from None
        digest = profile_cache.source_digest(raw)
        profile = None
        data = profile_cache.load(path, digest)
        if data is not None:
            try:
                profile = _Reader(str(path)).profile(data)
            except OperatorProfileError:  # a copy that does not hold a profile: parse the YAML
                profile = None
        if profile is None:
            try:
                data = yaml.load(raw.decode("utf-8", errors="replace"), Loader=_Loader)
            except yaml.YAMLError as e:
                raise OperatorProfileError(f"{path}: not valid YAML ({e})") from None
            profile = _Reader(str(path)).profile(data)
            profile_cache.store(path, digest, data, len(raw),
                                package_data=path.resolve().parent == PROFILES_DIR.resolve())
        _CACHE[key] = profile
    return _CACHE[key]


def profile_candidates(profile: str | Path, base_dir: str | Path | None = None) -> list[Path]:
    """Where a config's ``cost_model.profile`` may be, in the order tried: a path (absolute,
    relative to the working directory or to ``base_dir``, the config's folder), then a shipped
    profile's name, with or without ``.yaml`` (both profile kinds are shipped side by side)."""
    name = Path(profile)
    candidates = [name]
    if base_dir is not None and not name.is_absolute():
        candidates.append(Path(base_dir) / name)
    return candidates + [PROFILES_DIR / name, PROFILES_DIR / f"{name}.yaml"]


def find_operator_profile(profile: str | Path, base_dir: str | Path | None = None) -> Path:
    """The file a config's ``cost_model.profile`` names (``rtx4090-llama-3.1-8b``)."""
    candidates = profile_candidates(profile, base_dir)
    for p in candidates:
        if p.is_file():
            return p
    shipped = sorted(p.stem for p in PROFILES_DIR.glob("*.yaml") if is_operator_profile(p))
    raise OperatorProfileError(
        f"cost_model.profile: {str(profile)!r} not found (tried {', '.join(map(str, dict.fromkeys(candidates)))}); "
        f"shipped operator profiles: {', '.join(shipped) or 'none'}"
    )


class _Reader(YamlReader):
    """Typed values out of the parsed YAML; every error names ``file: key.path``."""

    error = OperatorProfileError

    def ints(self, v: Any, key: str, minimum: int = 0) -> tuple[int, ...]:
        if not isinstance(v, list) or not v:
            raise self.fail(key, "expected a non-empty list of integers")
        for x in v:
            if isinstance(x, bool) or not isinstance(x, int) or x < minimum:
                raise self.fail(key, f"expected integers >= {minimum}, got {x!r}")
        if any(b <= a for a, b in zip(v, v[1:])):
            raise self.fail(key, "values must increase strictly")
        return tuple(v)

    def times(self, v: Any, key: str, n: int, allow_null: bool = False) -> tuple[float | None, ...]:
        if not isinstance(v, list) or len(v) != n:
            raise self.fail(key, f"expected a list of {n} times (us), got {type(v).__name__} "
                            f"of {len(v) if isinstance(v, list) else '?'}")
        out = []
        for x in v:
            if x is None and allow_null:
                out.append(None)
                continue
            if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x) or x < 0:
                raise self.fail(key, f"expected times >= 0 (us), got {x!r}")
            out.append(x * 1e-6)
        return tuple(out)

    def table(self, d: Any, key: str, axis: str) -> Table1D:
        d = self.mapping(d, key)
        x = self.ints(self.get(d, axis, key), f"{key}.{axis}", minimum=1)
        return Table1D(x, self.times(self.get(d, "time_us", key), f"{key}.time_us", len(x)))

    def tables(self, d: Any, key: str, axis: str, allow_empty: bool = False) -> dict[str, Table1D]:
        d = self.mapping(d, key)
        if not d and not allow_empty:
            raise self.fail(key, "expected at least one operator")
        return {str(name): self.table(v, f"{key}.{name}", axis) for name, v in d.items()}

    def attention(self, d: Any, key: str) -> AttentionGrid:
        d = self.mapping(d, key)
        axes = [self.ints(self.get(d, ax, key), f"{key}.{ax}") for ax in ATTENTION_AXES]
        size = math.prod(len(a) for a in axes)
        seconds = self.times(self.get(d, "time_us", key), f"{key}.time_us", size, allow_null=True)
        return AttentionGrid(*axes, seconds)

    def moe(self, d: Any, key: str) -> MoeGrid:
        d = self.mapping(d, key)
        tokens = self.ints(self.get(d, "tokens", key), f"{key}.tokens", minimum=1)
        experts = self.ints(self.get(d, "activated_experts", key), f"{key}.activated_experts", minimum=1)
        seconds = self.times(self.get(d, "time_us", key), f"{key}.time_us", len(tokens) * len(experts),
                             allow_null=True)
        grid = MoeGrid(tokens, experts, seconds)
        for j, a in enumerate(experts):
            if not grid.column(j)[0]:
                raise self.fail(f"{key}.time_us", f"no time measured at activated_experts {a}")
        return grid

    def profile(self, data: Any) -> OperatorProfile:
        data = self.mapping(data, "top level")
        version = self.get(data, "kvsim_operator_profile", "")
        if version != FORMAT_VERSION:
            raise self.fail("kvsim_operator_profile", f"version {version!r} is not supported "
                            f"(this kvsim reads {FORMAT_VERSION})")
        prov = self.mapping(self.get(data, "provenance", ""), "provenance")
        for k in PROVENANCE_KEYS:
            self.get(prov, k, "provenance")
        model = self.mapping(self.get(data, "model", ""), "model")
        for k in MODEL_SHAPE_KEYS:
            v = self.get(model, k, "model")
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise self.fail(f"model.{k}", f"expected an integer >= 1, got {v!r}")
        ops = self.mapping(self.get(data, "operators", ""), "operators")
        per_layer = self.mapping(self.get(ops, "per_layer", "operators"), "operators.per_layer")
        for k, v in per_layer.items():
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise self.fail(f"operators.per_layer.{k}", f"expected a count >= 0, got {v!r}")
        per_step = tuple(str(x) for x in ops.get("per_step") or ())
        tp_stable = tuple(str(x) for x in ops.get("tp_stable") or ())
        tps = self.mapping(self.get(data, "tp", ""), "tp")
        tp = {}
        for degree, t in tps.items():
            if isinstance(degree, bool) or not isinstance(degree, int) or degree < 1:
                raise self.fail(f"tp.{degree}", "tensor-parallel degrees must be integers >= 1")
            key = f"tp.{degree}"
            t = self.mapping(t, key)
            dense = self.tables(self.get(t, "dense", key), f"{key}.dense", "tokens")
            for name in [*per_layer, *per_step]:
                if name not in dense:
                    raise self.fail(f"{key}.dense.{name}", "missing (named in operators)")
            tp[degree] = TPTables(
                dense,
                # may be empty: Vidur's profiles time no LM head or sampler
                self.tables(self.get(t, "per_sequence", key), f"{key}.per_sequence", "sequences",
                            allow_empty=True),
                self.attention(self.get(t, "attention", key), f"{key}.attention"),
                self.moe(t["moe"], f"{key}.moe") if "moe" in t else None,
            )
        if 1 not in tp:
            raise self.fail("tp", "a profile must hold tensor-parallel degree 1")
        name = str(data.get("name") or Path(self.source).stem)
        return OperatorProfile(name, {str(k): str(v) for k, v in prov.items()}, dict(model),
                               {str(k): v for k, v in per_layer.items()}, per_step, tp_stable, tp,
                               self.source)
