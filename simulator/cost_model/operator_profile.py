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
        attention:         # one layer's attention at points of a 4-D grid
          prefill_chunk: [0, 16, ..., 2048]   # new prompt tokens of the prefill chunk
          kv_prefill: [0, 16, ..., 16384]     # tokens cached before the chunk
          n_decode: [0, 1, ..., 256]          # decoding sequences
          kv_decode: [0, 16, ..., 16384]      # tokens each decoding sequence holds
          time_us: [null, 9.31, ...]          # dense form: the whole product, C order, null = not measured
          # or, instead of time_us, the sparse form: the measured points only, one column per
          # axis (values of the axis above) and their times, same length, each point once
          # points: {prefill_chunk: [16, 16, ...], kv_prefill: [0, 16, ...], n_decode: [0, 0, ...],
          #          kv_decode: [0, 0, ...], time_us: [9.31, 9.40, ...]}
        moe:               # mixture-of-experts models only: one MoE block (router + experts),
          tokens: [1, 2, ..., 2048]           # C order, null = not measured (simulator.cost_model.moe)
          activated_experts: [8, 16, ..., 128]
          time_us: [50.2, null, ...]

Times are microseconds in the file (as measured) and seconds once read.

The attention grid is held sparse in memory (``AttentionGrid``: the measured points keyed by
axis indices), and written in whichever form is smaller: ``points`` when five numbers per
measured point are fewer than the product of the axes' lengths (Vidur's grids: prefill
points ``(chunk, prefix, 0, 0)`` and decode points ``(0, 0, batch, context)`` only, on axes
whose product reaches hundreds of millions of cells), else ``time_us``. Both forms read to
the same grid and the same step times; the shipped profiles are written dense and read as they
are. The binary copy (``profile_cache``) stores the sparse columns as typed arrays, like any
long list.

``tp`` may lack degree 1 (Vidur profiles some large models only at degrees above 1); a run
at a degree the profile lacks then needs degree 1 to scale from (``profiled``).

``model.vocab_size`` is the vocabulary the profiler ran, which may be the model's padded
(``vidur_import``: Vidur pads Llama-2's 32,000 to 32,768); ``model.unpadded_vocab_size``, when
present, is the model's own, and ``model.vocab_size_by_tp`` the vocabulary of each degree
when they differ. ``profiled.check_profile_model`` accepts the model's vocabulary or its
padding (``padded_vocab_sizes``).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping
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


#: sarathi-serve pads the vocabulary of its embedding and LM head to a multiple of this
VOCAB_PAD_MULTIPLE = 64


def padded_vocab_sizes(vocab: int) -> tuple[int, ...]:
    """The vocabularies a profiler may have run for a model of ``vocab`` tokens: ``vocab``
    itself, rounded up to a multiple of 64, and rounded up to a power of two (sorted, distinct).

    Sources (microsoft/vidur, microsoft/sarathi-serve on GitHub):

    - Vidur's profiler takes the vocabulary from its own model config
      (``vidur/profiling/common/model_config.py``: ``ModelConfig.from_model_name`` reads
      ``data/model_configs/<org>/<model>.yml``) and writes it into ``mlp.csv``'s
      ``vocab_size`` column (``vidur/profiling/mlp/mlp_wrapper.py``). It computes no padding:
      the padded value is written in the configs. ``Llama2ModelConfig`` (``vidur/config/
      model_config.py``: Llama-2-7B, Llama-2-70B, CodeLlama-34B) and
      ``data/model_configs/meta-llama/Llama-2-70b-hf.yml`` say ``vocab_size: 32768`` for
      Llama-2's 32,000 tokens: the next power of two. The other configs keep the Hugging Face
      value (Qwen-72B 152,064, internlm2-20b 92,544, phi-2 51,200, Meta-Llama-3 128,256).
    - sarathi-serve, whose layers Vidur times, pads the embedding and LM head to a multiple
      of 64 (``sarathi/model_executor/models/llama.py``:
      ``vocab_size = ((config.vocab_size + 63) // 64) * 64``; vLLM's
      ``DEFAULT_VOCAB_PADDING_SIZE = 64`` likewise).

    The vocabulary changes only the embedding table's size (a lookup, not a product) and the
    LM head, which Vidur does not time: a padded profile times the model's steps.
    """
    if vocab < 1:
        return (vocab,)
    multiple = -(-vocab // VOCAB_PAD_MULTIPLE) * VOCAB_PAD_MULTIPLE
    return tuple(sorted({vocab, multiple, 1 << (vocab - 1).bit_length()}))


class OperatorProfileError(ValueError):
    """An operator profile is missing, unreadable or malformed (one line: file and key)."""


@dataclass(frozen=True)
class Table1D:
    """Measured seconds at increasing values of one quantity (tokens or sequences)."""

    x: tuple[int, ...]
    seconds: tuple[float, ...]


@dataclass(frozen=True)
class AttentionGrid:
    """One layer's attention time (s) at points of the product of the four axes.

    ``seconds`` holds the measured points only, keyed by their axis indices
    ``(i, j, k, m)`` in C order (sorted): memory grows with the points measured, not with
    the product of the axes (Vidur's prefill and decode rows span axes whose product runs to
    hundreds of millions of cells). A dense sequence over the product in C order, ``None``
    where not measured (the file's dense form), is accepted too and kept as its measured cells.
    """

    prefill_chunk: tuple[int, ...]
    kv_prefill: tuple[int, ...]
    n_decode: tuple[int, ...]
    kv_decode: tuple[int, ...]
    seconds: Mapping[tuple[int, int, int, int], float]

    def __post_init__(self):
        shape = self.shape
        if isinstance(self.seconds, Mapping):
            cells = sorted(self.seconds.items())
            for key, _ in cells:
                if len(key) != 4 or not all(0 <= x < n for x, n in zip(key, shape)):
                    raise ValueError(f"attention point {key} is outside the axes ({shape} values)")
        else:
            dense = tuple(self.seconds)
            if len(dense) != math.prod(shape):
                raise ValueError(f"dense attention times: {len(dense)} values for {math.prod(shape)} cells")
            cells = [(key, t) for key, t in zip(itertools.product(*map(range, shape)), dense) if t is not None]
        object.__setattr__(self, "seconds", dict(cells))

    @property
    def shape(self) -> tuple[int, int, int, int]:
        """The number of values on each axis."""
        return len(self.prefill_chunk), len(self.kv_prefill), len(self.n_decode), len(self.kv_decode)

    @property
    def cells(self) -> int:
        """Cells of the product of the axes (what a dense form holds)."""
        return math.prod(self.shape)

    def at(self, i: int, j: int, k: int, m: int) -> float | None:
        """Seconds at axis indices ``(i, j, k, m)`` (None: not measured)."""
        return self.seconds.get((i, j, k, m))

    def points(self) -> list[tuple[int, int, int, int, float]]:
        """Every measured point as ``(prefill_chunk, kv_prefill, n_decode, kv_decode, s)``, in C order."""
        pc, kp, nd, kd = self.prefill_chunk, self.kv_prefill, self.n_decode, self.kv_decode
        return [(pc[i], kp[j], nd[k], kd[m], t) for (i, j, k, m), t in self.seconds.items()]

    def sparse_in_file(self) -> bool:
        """Whether the file's sparse form (five numbers a point) is smaller than the dense one."""
        return 5 * len(self.seconds) < self.cells


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
    model: dict[str, Any]  # name, variant, architecture and the shapes measured (at TP 1)
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
                "attention": {**{ax: list(getattr(a, ax)) for ax in ATTENTION_AXES}, **_attention_times(a, us)},
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


def _attention_times(a: AttentionGrid, us) -> dict:
    """The grid's times in the file: ``points`` (sparse) when smaller, else ``time_us`` (dense)."""
    if a.sparse_in_file():
        pts = a.points()
        return {"points": {**{ax: [p[n] for p in pts] for n, ax in enumerate(ATTENTION_AXES)},
                           "time_us": us(p[4] for p in pts)}}
    return {"time_us": us(a.at(*key) for key in itertools.product(*map(range, a.shape)))}


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
        if ("time_us" in d) == ("points" in d):
            raise self.fail(key, "expected either time_us (dense) or points (sparse)")
        if "time_us" in d:
            size = math.prod(len(a) for a in axes)
            return AttentionGrid(*axes, self.times(d["time_us"], f"{key}.time_us", size, allow_null=True))
        pts = self.mapping(d["points"], f"{key}.points")
        times = self.get(pts, "time_us", f"{key}.points")
        if not isinstance(times, list) or not times:
            raise self.fail(f"{key}.points.time_us", "expected a non-empty list of times (us)")
        n = len(times)
        seconds = self.times(times, f"{key}.points.time_us", n)
        columns = []
        for ax, values in zip(ATTENTION_AXES, axes):
            k = f"{key}.points.{ax}"
            col = self.get(pts, ax, f"{key}.points")
            if not isinstance(col, list) or len(col) != n:
                raise self.fail(k, f"expected a list of {n} values (one per time)")
            index = {v: i for i, v in enumerate(values)}
            ix = [index.get(v) if type(v) is int else None for v in col]
            if None in ix:
                bad = col[ix.index(None)]
                raise self.fail(k, f"{bad!r} is not a value of {key}.{ax}")
            columns.append(ix)
        cells = dict(zip(zip(*columns), seconds))
        if len(cells) != n:
            raise self.fail(f"{key}.points", "a point is listed more than once")
        return AttentionGrid(*axes, cells)

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
        if not tp:
            raise self.fail("tp", "expected at least one tensor-parallel degree")
        name = str(data.get("name") or Path(self.source).stem)
        return OperatorProfile(name, {str(k): str(v) for k, v in prov.items()}, dict(model),
                               {str(k): v for k, v in per_layer.items()}, per_step, tp_stable, tp,
                               self.source)
