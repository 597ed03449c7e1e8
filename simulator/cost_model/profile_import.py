"""``kvsim calibrate --import DIR``: a public operator-profile bundle -> a kvsim operator profile.

Two formats, detected from the folder's files (or ``--format``): this module reads
LLMServingSim's bundle; ``simulator.cost_model.vidur_import`` reads Vidur's ``data/profiling``
CSVs (``mlp.csv`` + ``attention.csv``).

The bundle format is LLMServingSim's profiler output (casys-kaist/LLMServingSim,
``docs/docs/profiler/output-bundle.md``; a copy is in
``shared/validation/vllm-0.19-rtx4090-llama-3.1-8b/profile/FORMAT-upstream.md``)::

    DIR/meta.yaml               versions, GPU, model, engine settings, grids
    DIR/tp<N>/dense.csv         layer,tokens,time_us        per-layer dense operators
    DIR/tp<N>/per_sequence.csv  layer,sequences,time_us     once-per-step operators
    DIR/tp<N>/attention.csv     prefill_chunk,kv_prefill,n_decode,kv_decode,time_us

The result is one YAML file (``simulator.cost_model.operator_profile`` documents it) with
its provenance, written to ``--out`` (default ``results/profiles``, beside the other
results; never the package's shipped ``gpu_validation/profiles`` unless asked) as
``<name>.yaml`` together with the bundle's ``LICENSE`` and ``SOURCES.md`` (the nearest ones
in DIR or a folder above it, up to the root of the repository DIR is in), copied as
``<name>.LICENSE`` and ``<name>.SOURCES.md``. ``<name>`` defaults to
``profile_names.profile_name`` of the bundle's GPU and model (``rtx-pro-6000-llama-3.1-8b``),
the name ``kvsim validate`` looks for. A
config names it by path (``cost_model.profile: results/profiles/<name>.yaml``). ``<name>`` is
a plain slug, and a file there that kvsim did not write is never replaced
(:mod:`simulator.outputs`).

How a step is assembled from the operators is the model architecture's, which the bundle
names but does not contain (upstream keeps it in ``profiler/models/<arch>.yaml``): for the
Llama family each decoder layer runs two RMSNorms, the QKV projection, rotary embedding,
attention, the output projection, the fused gate/up projection, SiLU-and-mul and the down
projection; the embedding and the final norm run once per step over all tokens, the LM
head and the sampler once per step over the sampled sequences. Qwen3 adds a per-head
``qk_norm``. Qwen3-MoE (``qwen3_moe``: Qwen3-30B-A3B, -235B-A22B) has Qwen3's attention and,
in place of the MLP, one MoE block per layer (router and fused experts, profiled as one unit:
upstream's ``profiler/models/qwen3.yaml``), timed in ``tp1/moe.csv``
(``tokens,activated_experts,time_us``, imported as the profile's ``moe`` grid; at tensor
parallelism 1 only, so other degrees use it too: ``simulator.cost_model.moe``). The grid also
gives the model's routed experts (the most activated) and experts per token (those one token
activates), recorded in the profile's model and checked against the configured model. Other
architectures are refused rather than guessed.

``skew.csv`` (attention of decode batches with unequal contexts) is not imported: the
profiled model times a decode batch at its mean context. The importer measures what that
costs on the bundle's own skew shots and records it in the profile's notes.

Plain Python + PyYAML: no torch, numpy, simpy or pydantic. It needs no GPU, so it lives with
the format it writes (``operator_profile``), not in ``gpu_validation``, which the simulator
never imports.
"""

from __future__ import annotations

import argparse
import math
import re
import statistics
import sys
from pathlib import Path

import yaml

from kvsim.simulator.cost_model import import_files
from kvsim.simulator.cost_model.moe import MoeGrid
from kvsim.simulator.cost_model.operator_profile import (
    ATTENTION_AXES,
    PROFILES_DIR,
    AttentionGrid,
    OperatorProfile,
    Table1D,
    TPTables,
    read_operator_profile,
)
from kvsim.simulator.cost_model.profile_names import gpu_key, profile_name
from kvsim.simulator.cost_model.vidur_import import VidurFormatError, import_vidur, is_vidur_folder
from kvsim.simulator.outputs import OutputError, check_name

# Dense operators per decoder layer, per step, and those tensor parallelism does not shard
# (upstream's ``tp_stable``: norms and the sampler are replicated on every GPU).
_LLAMA_LAYER = {"layernorm": 2, "qkv_proj": 1, "rotary_emb": 1, "o_proj": 1, "gate_up_proj": 1,
                "act_fn": 1, "down_proj": 1}
_QWEN3_ATTENTION = {"layernorm": 2, "qkv_proj": 1, "qk_norm": 1, "rotary_emb": 1, "o_proj": 1}
ARCHITECTURES = {
    "llama": (_LLAMA_LAYER, ("embedding", "final_layernorm"), ("layernorm", "final_layernorm", "sampler")),
    "qwen3": ({**_LLAMA_LAYER, "qk_norm": 1}, ("embedding", "final_layernorm"),
              ("layernorm", "final_layernorm", "sampler")),
    "qwen3_moe": (_QWEN3_ATTENTION, ("embedding", "final_layernorm"), ("layernorm", "final_layernorm", "sampler")),
}
MOE_ARCHITECTURES = ("qwen3_moe",)  # their MLP is the MoE block of tp1/moe.csv


class BundleError(ValueError):
    """The bundle is missing a file or holds something this importer cannot read."""


def _read_yaml(path: Path) -> dict:
    try:
        data = yaml.safe_load(path.read_text())
    except OSError as e:
        raise BundleError(f"{path}: cannot read ({e.strerror})") from None
    except yaml.YAMLError as e:
        raise BundleError(f"{path}: not valid YAML ({e})") from None
    if not isinstance(data, dict):
        raise BundleError(f"{path}: expected a mapping at the top level")
    return data


def _read_csv(path: Path, columns: tuple[str, ...]) -> list[dict[str, str]]:
    return import_files.read_rows(path, columns, BundleError)


def _number(row: dict[str, str], col: str, path: Path, line: int, integer: bool) -> float:
    return import_files.cell_number(row, col, path, line, integer, BundleError)


def _tables(path: Path, axis: str) -> dict[str, Table1D]:
    """``layer,<axis>,time_us`` rows -> one table per layer, sorted by the axis (s)."""
    rows = _read_csv(path, ("layer", axis, "time_us"))
    by_layer: dict[str, dict[int, float]] = {}
    for line, r in enumerate(rows, start=2):
        x = int(_number(r, axis, path, line, True))
        t = _number(r, "time_us", path, line, False)
        points = by_layer.setdefault(r["layer"], {})
        if x in points:
            raise BundleError(f"{path}:{line}: {r['layer']} at {axis}={x} appears twice")
        points[x] = t * 1e-6
    return {name: Table1D(tuple(sorted(p)), tuple(p[x] for x in sorted(p))) for name, p in by_layer.items()}


def _attention(path: Path) -> AttentionGrid:
    rows = _read_csv(path, (*ATTENTION_AXES, "time_us"))
    points = {}
    for line, r in enumerate(rows, start=2):
        key = tuple(int(_number(r, ax, path, line, True)) for ax in ATTENTION_AXES)
        if key in points:
            raise BundleError(f"{path}:{line}: point {key} appears twice")
        points[key] = _number(r, "time_us", path, line, False) * 1e-6
    if not points:
        raise BundleError(f"{path}: no rows")
    axes = [sorted({k[i] for k in points}) for i in range(4)]
    seconds = [points.get((a, b, c, d)) for a in axes[0] for b in axes[1] for c in axes[2] for d in axes[3]]
    return AttentionGrid(*(tuple(a) for a in axes), tuple(seconds))


def _moe_grid(path: Path) -> MoeGrid:
    """``tokens,activated_experts,time_us`` rows -> the MoE block's grid (s; None where the
    profile did not measure: it times at most ``tokens x k`` experts)."""
    rows = _read_csv(path, ("tokens", "activated_experts", "time_us"))
    points = {}
    for line, r in enumerate(rows, start=2):
        key = (int(_number(r, "tokens", path, line, True)), int(_number(r, "activated_experts", path, line, True)))
        if min(key) < 1:
            raise BundleError(f"{path}:{line}: tokens and activated_experts must be >= 1")
        if key in points:
            raise BundleError(f"{path}:{line}: point {key} appears twice")
        points[key] = _number(r, "time_us", path, line, False) * 1e-6
    if not points:
        raise BundleError(f"{path}: no rows")
    tokens, experts = sorted({k[0] for k in points}), sorted({k[1] for k in points})
    grid = MoeGrid(tuple(tokens), tuple(experts), tuple(points.get((t, a)) for t in tokens for a in experts))
    if tokens[0] != 1 or grid.experts_per_token < 1:
        raise BundleError(f"{path}: no row at tokens 1 (it gives the experts one token activates)")
    return grid


def mean_context_error(skew_csv: Path) -> tuple[float, float, int] | None:
    """(median, p95, shots) of ``|t_mean / t_skew - 1|``: the error of timing a decode batch
    with unequal contexts at its mean context, on the bundle's measured skew shots."""
    if not skew_csv.is_file():
        return None
    errs = []
    for r in _read_csv(skew_csv, ("t_mean_us", "t_skew_us")):
        try:
            mean, skew = float(r["t_mean_us"]), float(r["t_skew_us"])
        except ValueError:
            continue
        if skew > 0 and math.isfinite(mean):
            errs.append(abs(mean / skew - 1))
    if not errs:
        return None
    errs.sort()
    return statistics.median(errs), errs[min(len(errs) - 1, int(0.95 * len(errs)))], len(errs)


def default_name(meta: dict) -> str:
    """``profile_names.profile_name`` of the bundle's GPU (its device name, else its hardware
    label) and model: ``rtx4090-llama-3.1-8b``, ``rtx-pro-6000-qwen3-32b``."""
    device, label = str(meta.get("gpu", "")), str(meta.get("hardware", "gpu"))
    gpu = (gpu_key(device) if device else None) or gpu_key(label) or label
    return profile_name(gpu, str(meta.get("model", "model")))


def convert(bundle: str | Path, name: str | None = None) -> tuple[OperatorProfile, Path | None, Path | None]:
    """Read a bundle (the folder holding ``meta.yaml``, or one that holds ``profile/meta.yaml``);
    return the profile and the LICENSE and SOURCES.md files found for it."""
    root = Path(bundle)
    if not (root / "meta.yaml").is_file() and (root / "profile" / "meta.yaml").is_file():
        root = root / "profile"
    if not (root / "meta.yaml").is_file():
        raise BundleError(f"{bundle}: no meta.yaml here or in {Path(bundle) / 'profile'} "
                          "(expected an LLMServingSim profiler bundle)")
    meta = _read_yaml(root / "meta.yaml")
    arch = str(meta.get("architecture", ""))
    if arch not in ARCHITECTURES:
        raise BundleError(f"{root / 'meta.yaml'}: architecture {arch!r}: operator layout unknown; "
                          f"this importer knows {', '.join(ARCHITECTURES)}")
    per_layer, per_step, tp_stable = ARCHITECTURES[arch]
    degrees = sorted(int(p.name[2:]) for p in root.glob("tp*") if re.fullmatch(r"tp\d+", p.name))
    if 1 not in degrees:
        raise BundleError(f"{root}: no tp1/ folder (every profile needs tensor-parallel degree 1)")
    tp = {}
    for d in degrees:
        folder = root / f"tp{d}"
        moe = None
        if (folder / "moe.csv").is_file():
            if arch not in MOE_ARCHITECTURES:
                raise BundleError(f"{folder / 'moe.csv'}: architecture {arch} has no mixture-of-experts layers")
            moe = _moe_grid(folder / "moe.csv")
        elif arch in MOE_ARCHITECTURES and d == 1:
            raise BundleError(f"{folder / 'moe.csv'}: missing (architecture {arch} runs a MoE block per layer)")
        dense = _tables(folder / "dense.csv", "tokens")
        for op in [*per_layer, *per_step]:
            if op not in dense:
                raise BundleError(f"{folder / 'dense.csv'}: no rows for operator {op!r} "
                                  f"(architecture {arch} runs it)")
        tp[d] = TPTables(dense, _tables(folder / "per_sequence.csv", "sequences"),
                         _attention(folder / "attention.csv"), moe)
    # hf_overrides hold the per-GPU shapes of the last degree profiled (the largest): scale to TP 1.
    over = (meta.get("engine_effective") or {}).get("hf_overrides") or {}
    scale = max(int(x) for x in (meta.get("tp_degrees") or [1]))
    keys = {"num_heads": "num_attention_heads", "num_kv_heads": "num_key_value_heads",
            "ffn_size": "intermediate_size", "vocab_size": "vocab_size"}
    model = {"name": str(meta.get("model", "")), "variant": str(meta.get("variant", "")), "architecture": arch}
    grid = tp[1].moe
    if grid is not None:  # the model's experts, as the grid measured them (module docstring)
        model["num_experts"], model["experts_per_token"] = grid.num_experts, grid.experts_per_token
    for k, upstream in keys.items():
        if upstream not in over:
            raise BundleError(f"{root / 'meta.yaml'}: engine_effective.hf_overrides.{upstream}: missing")
        model[k] = int(over[upstream]) * scale
    engine = meta.get("engine_effective") or {}
    licence_file = import_files.find_up_to_root(root, "LICENSE")
    sources_file = import_files.find_up_to_root(root, "SOURCES.md")
    name = name or default_name(meta)
    source = import_files.first_paragraph(sources_file.read_text()) if sources_file else ""
    provenance = {
        "source": source or f"LLMServingSim profiler bundle {root.name}",
        "gpu": str(meta.get("gpu", "")),
        "hardware": str(meta.get("hardware", "")),
        "engine": f"vLLM {meta.get('vllm_version', '?')}",
        "cuda": str(meta.get("cuda_version", "")),
        "profiler": f"LLMServingSim profiler {meta.get('profiler_version', '?')}",
        "date": str(meta.get("profiled_at", "")),
        "licence": f"{import_files.licence_summary(licence_file.read_text())}; see {name}.LICENSE"
        if licence_file else "unknown",
        "attribution": f"{name}.SOURCES.md" if sources_file else "",
        "measurement": f"{meta.get('measurement_iterations', '?')} timed forwards per shot, "
        f"enforce_eager={engine.get('enforce_eager')}, KV block size {engine.get('block_size', '?')} "
        "(vLLM's paged attention), one decoder layer (per-layer times are multiplied by the model's layers)",
        "imported_by": "kvsim calibrate --import",
    }
    err = mean_context_error(root / "tp1" / "skew.csv")
    if err is not None:
        provenance["notes"] = (
            f"skew tables not imported: decode attention is timed at the batch's mean context, "
            f"which is off by median {100 * err[0]:.1f}%, p95 {100 * err[1]:.1f}% on the bundle's "
            f"{err[2]} unequal-context shots (tp1/skew.csv)")
    return (OperatorProfile(name, provenance, model, dict(per_layer), per_step, tp_stable, tp),
            licence_file, sources_file)


def import_bundle(bundle: str | Path, out_dir: str | Path = PROFILES_DIR, name: str | None = None) -> Path:
    """Convert ``bundle`` and write ``<out_dir>/<name>.yaml`` plus its licence and attribution,
    then read it back once, which leaves its binary copy beside it (``profile_cache``): the
    first run that uses it does not parse a megabyte of YAML."""
    profile, licence_file, sources_file = convert(bundle, name)
    path = import_files.write_with_sources(profile, out_dir, licence_file, sources_file)
    read_operator_profile(path)
    return path


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="kvsim calibrate --import",
                                description="Import a public operator profile: an LLMServingSim bundle "
                                "(meta.yaml + tp<N>/) or a Vidur model folder (mlp.csv + attention.csv).")
    p.add_argument("--import", dest="bundle", required=True, metavar="DIR",
                   help="bundle folder (meta.yaml and tp<N>/) or Vidur's compute/<gpu>/<org>/<model>/ folder")
    p.add_argument("--format", choices=("auto", "bundle", "vidur"), default="auto",
                   help="the folder's format (default: detected from its files)")
    p.add_argument("--name", help="profile name (default: <gpu>-<model> as kvsim validate looks it up, e.g. "
                   "rtx-pro-6000-llama-3.1-8b)")
    p.add_argument("--gpu", help="Vidur format: GPU label when the path does not name it (e.g. a100)")
    p.add_argument("--model", help="Vidur format: model name when the path does not name it (org/name)")
    p.add_argument("--out", default=str(import_files.DEFAULT_OUT_DIR),
                   help=f"output folder (default: {import_files.DEFAULT_OUT_DIR}); a file there that kvsim did "
                   "not write is never replaced")
    args = p.parse_args(argv)
    try:
        if args.name is not None:  # an empty name too: given, so it must be a plain slug
            check_name(args.name, "--name")
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    fmt = args.format
    if fmt == "auto":
        fmt = "vidur" if is_vidur_folder(args.bundle) else "bundle"
    try:
        if fmt == "vidur":
            path = import_vidur(args.bundle, args.out, args.name, args.gpu, args.model)
        else:
            path = import_bundle(args.bundle, args.out, args.name)
    except (BundleError, VidurFormatError, OutputError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"profile: {path}")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
