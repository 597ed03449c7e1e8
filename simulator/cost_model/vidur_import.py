"""``kvsim calibrate --import DIR``: Vidur's operator profiling CSVs -> a kvsim operator profile.

Vidur (microsoft/vidur, MIT) ships per-GPU, per-model kernel profiles measured with its
sarathi-serve based profiler (vLLM's kernels)::

    data/profiling/compute/<gpu>/<org>/<model>/mlp.csv        one row per (num_tokens, TP degree)
    data/profiling/compute/<gpu>/<org>/<model>/attention.csv  one row per attention shape

Every time column is ``time_stats.<operator>.{min,max,mean,median,std}`` in **milliseconds**
(Vidur's CUDA timer records ``torch.cuda.Event.elapsed_time``) for **one decoder layer**; the
importer reads the medians (Vidur's own predictors train on them). ``DIR`` is the model folder;
the GPU and the model's name are read from the path (``.../compute/a100/meta-llama/Meta-Llama-3-8B``)
unless given.

How the tables map onto kvsim's (``simulator.cost_model.operator_profile``):

- ``mlp.csv`` -> dense operators by token count (``num_tokens``), per tensor-parallel degree
  (``num_tensor_parallel_workers``). Per decoder layer, as Vidur's predictor sums them:
  ``input_layernorm``, ``attn_pre_proj`` (QKV), ``attn_rope``, ``attn_post_proj`` (output
  projection), ``post_attention_layernorm``, ``mlp_up_proj`` (gate + up), ``mlp_act``,
  ``mlp_down_proj`` and one ``add`` (Vidur counts one residual add per layer); ``emb`` once per
  step. A token count measured more than once is the mean of its rows.
- Vidur profiles no LM head and no sampler: the profile has no per-sequence tables, so the
  profiled model's steps lack them (about 0.6 ms a step for Llama-3-8B's 1 GB LM head on an
  A100, by its bandwidth; the README's roofline table shows the effect).
- ``attention.csv`` -> the 4-D attention grid, exactly where the shapes map: a prefill row
  (``is_prefill``, ``batch_size`` 1, a chunk of ``prefill_chunk_size`` tokens over
  ``kv_cache_size`` cached ones) is the point ``(chunk, prefix, 0, 0)``; a decode row
  (``batch_size`` sequences each holding ``kv_cache_size`` tokens) is ``(0, 0, batch, context)``.
  Its time is the sum of the row's attention operators (input reshape, KV-cache write,
  prefill or decode kernel, output reshape). Vidur never times a chunk and decodes in one
  kernel launch (it adds the two predictions), so the grid has no mixed points; the profiled
  model then times a mixed step the same way, the chunk's attention plus the decodes'.

Vidur's grid is not a product grid: chunks every 16-32 tokens over prefixes at every multiple
of the chunk, batches at every size over many contexts, and only prefill points and decode
points, so the product of the distinct values on the four axes runs to hundreds of millions
of cells. The grid keeps the measured points only (``AttentionGrid`` is sparse: memory and
import time grow with the rows), every shape Vidur did not measure is a hole, never invented,
and the profile file lists the points (``operator_profile``'s sparse ``points`` form,
written whenever it is smaller than the dense one). The extract shipped in
``gpu_validation/profiles/a100-llama-3-8b.vidur`` keeps the rows on a coarse grid (its
SOURCES.md lists them).

Tensor parallelism: the profile holds every degree both files have rows for (the other
rows are dropped); a folder whose files share none is refused, naming each file's degrees.
Vidur profiles some large models (Llama-2-70B, Qwen-72B) only at degrees above 1 in some
files: the profile then lacks degree 1, and a run at a degree it lacks fails with one line
naming the degrees it has (``profiled.check_profile_degree``; with degree 1 present, other
degrees scale degree 1's tables as for any profile).

Vocabulary: ``mlp.csv``'s ``vocab_size`` is the vocabulary Vidur's profiler ran, from Vidur's
own model configs, which pad some models' (Llama-2's and CodeLlama's 32,000 to 32,768). The
profile's ``model.vocab_size`` is that vocabulary (the smallest degree's; rows of one degree
must agree, degrees may differ in it and nothing else: then ``model.vocab_size_by_tp`` lists
them); when the catalogue has a model of these shapes whose vocabulary pads to it, that one is
recorded too (``model.unpadded_vocab_size``, and in the provenance notes). The profiled model
accepts the model's vocabulary or its padding by the rule of
``operator_profile.padded_vocab_sizes`` (sources cited there) and refuses any other.

Plain Python, like ``profile_import``: no numpy, pandas or torch.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

from kvsim.simulator.cost_model import import_files
from kvsim.simulator.cost_model.catalogue import MODELS
from kvsim.simulator.cost_model.operator_profile import (
    PROFILES_DIR,
    AttentionGrid,
    OperatorProfile,
    Table1D,
    TPTables,
    padded_vocab_sizes,
)

#: Vidur's dense operators per decoder layer (times per step) and once per step.
PER_LAYER = {"input_layernorm": 1, "attn_pre_proj": 1, "attn_rope": 1, "attn_post_proj": 1,
             "post_attention_layernorm": 1, "mlp_up_proj": 1, "mlp_act": 1, "mlp_down_proj": 1, "add": 1}
PER_STEP = ("emb",)
#: not sharded by tensor parallelism (norms and the residual add run on full activations)
TP_STABLE = ("input_layernorm", "post_attention_layernorm", "add")
#: attention operators of one row, summed (absent columns count 0, as in Vidur)
ATTENTION_PARTS = ("attn_input_reshape", "attn_kv_cache_save", "attn_prefill", "attn_decode",
                   "attn_output_reshape")
MLP_SHAPE = ("n_head", "n_kv_head", "n_embd", "n_expanded_embd", "vocab_size")
MS = 1e-3  # seconds per millisecond


class VidurFormatError(ValueError):
    """A Vidur profile folder is missing a file, a column or holds a value this importer refuses."""


def is_vidur_folder(path: str | Path) -> bool:
    """Whether ``path`` holds Vidur's ``mlp.csv`` and ``attention.csv`` (and no ``meta.yaml``)."""
    p = Path(path)
    return (p / "mlp.csv").is_file() and (p / "attention.csv").is_file() and not (p / "meta.yaml").is_file()


def _rows(path: Path, needed: tuple[str, ...]) -> Iterator[tuple[int, dict[str, str]]]:
    """``(line, row)`` of each row, read one at a time (Vidur's tables run to 100,000s of rows)."""
    line = 1
    for line, row in enumerate(import_files.iter_rows(path, needed, VidurFormatError), start=2):
        yield line, row
    if line == 1:
        raise VidurFormatError(f"{path}: no rows")


def _num(row: dict[str, str], col: str, path: Path, line: int, integer: bool = False) -> float:
    return import_files.cell_number(row, col, path, line, integer, VidurFormatError)


def _median(op: str) -> str:
    return f"time_stats.{op}.median"


def read_mlp(path: Path) -> tuple[dict[int, dict[str, Table1D]], dict[str, int], dict[int, int]]:
    """Dense tables per TP degree (seconds by token count), the model shape the rows share
    (heads, KV heads, widths) and the vocabulary of each degree's rows (one per degree; degrees
    may differ in it alone: ``operator_profile.padded_vocab_sizes``)."""
    ops = [*PER_LAYER, *PER_STEP]
    shape: dict[str, int] | None = None
    vocab: dict[int, int] = {}
    samples: dict[int, dict[str, dict[int, list[float]]]] = defaultdict(lambda: defaultdict(lambda: defaultdict(list)))
    for line, r in _rows(path, (*map(_median, ops), *MLP_SHAPE, "num_tokens", "num_tensor_parallel_workers")):
        s = {k: int(_num(r, k, path, line, integer=True)) for k in MLP_SHAPE}
        v = s.pop("vocab_size")
        if shape is None:
            shape = s
        elif s != shape:
            raise VidurFormatError(f"{path}:{line}: model shape {s} differs from the first row's {shape} "
                                   "(one model per folder)")
        tp = int(_num(r, "num_tensor_parallel_workers", path, line, integer=True))
        tokens = int(_num(r, "num_tokens", path, line, integer=True))
        if tp < 1 or tokens < 1:
            raise VidurFormatError(f"{path}:{line}: num_tokens and num_tensor_parallel_workers must be >= 1")
        if vocab.setdefault(tp, v) != v:
            raise VidurFormatError(f"{path}:{line}: vocab_size {v} differs from {vocab[tp]} in the rows of "
                                   f"tensor-parallel degree {tp} (one vocabulary per degree)")
        for op in ops:
            samples[tp][op][tokens].append(_num(r, _median(op), path, line) * MS)
    tables = {tp: {op: Table1D(tuple(sorted(pts)), tuple(sum(pts[x]) / len(pts[x]) for x in sorted(pts)))
                   for op, pts in by_op.items()} for tp, by_op in samples.items()}
    assert shape is not None
    return tables, shape, vocab


def read_attention(path: Path) -> tuple[dict[int, AttentionGrid], dict[str, str]]:
    """The attention grid per TP degree, and the settings the rows share (block size, backend)."""
    parts: list[str] = []
    settings: dict[str, str] = {}
    points: dict[int, dict[tuple[int, int, int, int], list[float]]] = defaultdict(lambda: defaultdict(list))
    for line, r in _rows(path, ("batch_size", "prefill_chunk_size", "kv_cache_size", "is_prefill",
                                "num_tensor_parallel_workers")):
        if line == 2:  # the columns, and the settings the rows share, from the first row
            parts = [_median(p) for p in ATTENTION_PARTS if _median(p) in r]  # their columns
            if not {_median("attn_prefill"), _median("attn_decode")} & set(parts):
                raise VidurFormatError(f"{path}: no time_stats.attn_prefill.median or "
                                       "time_stats.attn_decode.median column")
            settings = {k: r[k] for k in ("block_size", "attention_backend", "max_model_len") if k in r}
        tp = int(_num(r, "num_tensor_parallel_workers", path, line, integer=True))
        batch = int(_num(r, "batch_size", path, line, integer=True))
        chunk = int(_num(r, "prefill_chunk_size", path, line, integer=True))
        kv = int(_num(r, "kv_cache_size", path, line, integer=True))
        prefill = r["is_prefill"].strip().lower()
        if prefill not in ("true", "false"):
            raise VidurFormatError(f"{path}:{line}: is_prefill: expected True or False, got {r['is_prefill']!r}")
        if prefill == "true":
            if batch != 1 or chunk < 1:
                raise VidurFormatError(f"{path}:{line}: a prefill row needs batch_size 1 and prefill_chunk_size "
                                       f">= 1 (got {batch}, {chunk})")
            key = (chunk, kv, 0, 0)
        else:
            if chunk != 0 or batch < 1 or kv < 1:
                raise VidurFormatError(f"{path}:{line}: a decode row needs prefill_chunk_size 0, batch_size >= 1 "
                                       f"and kv_cache_size >= 1 (got {chunk}, {batch}, {kv})")
            key = (0, 0, batch, kv)
        seconds = sum(_num(r, c, path, line) for c in parts if r[c] != "") * MS
        points[tp][key].append(seconds)
    grids = {}
    for tp, pts in points.items():
        axes = [sorted({k[i] for k in pts} | {0}) for i in range(4)]
        if not any(k[0] for k in pts) or not any(k[2] for k in pts):
            raise VidurFormatError(f"{path}: tensor-parallel degree {tp} needs prefill and decode rows")
        index = [{v: i for i, v in enumerate(a)} for a in axes]
        cells = {tuple(ix[v] for ix, v in zip(index, k)): sum(v) / len(v) for k, v in pts.items()}
        grids[tp] = AttentionGrid(*(tuple(a) for a in axes), cells)  # the measured points only
    return grids, settings


def _listed(degrees) -> str:
    return ", ".join(map(str, sorted(degrees))) or "none"


def model_vocab(shape: dict[str, int], vocabs: set[int]) -> int | None:
    """The vocabulary of the catalogue's dense models of these shapes (heads, KV heads, MLP
    width) whose padding (``padded_vocab_sizes``) gives every one of ``vocabs``, when that
    names one vocabulary other than the profile's (Llama-2's 32,000 for Vidur's 32,768); None
    when no model, several, or one with the profile's own vocabulary matches."""
    same = [m for m in MODELS.values() if m.moe is None and (m.num_heads, m.num_kv_heads, m.ffn_size)
            == (shape["n_head"], shape["n_kv_head"], shape["n_expanded_embd"])]
    if any(m.vocab_size in vocabs for m in same):
        return None
    found = {m.vocab_size for m in same if vocabs <= set(padded_vocab_sizes(m.vocab_size))}
    return found.pop() if len(found) == 1 else None


def _path_names(folder: Path) -> tuple[str | None, str | None]:
    """(gpu, org/model) from ``.../compute/<gpu>/<org>/<model>``, if the path has that shape."""
    parts = folder.resolve().parts
    if "compute" in parts:
        i = len(parts) - 1 - parts[::-1].index("compute")
        rest = parts[i + 1:]
        if len(rest) >= 2:
            return rest[0], "/".join(rest[1:])
    return None, None


def default_name(gpu: str, model: str) -> str:
    """``<gpu>-<model basename>`` in lower case, ``meta-`` dropped: ``a100-llama-3-8b``."""
    base = re.sub(r"^meta-", "", model.rsplit("/", 1)[-1].lower())
    return re.sub(r"[^a-z0-9._-]+", "-", f"{gpu.lower()}-{base}")


def convert_vidur(folder: str | Path, name: str | None = None, gpu: str | None = None,
                  model: str | None = None) -> tuple[OperatorProfile, Path | None, Path | None]:
    """Read a Vidur model folder; return the profile and the LICENSE and SOURCES.md found for it
    (in the folder or up to seven folders above, so a copy of Vidur's tree finds its root's)."""
    root = Path(folder)
    if not root.is_dir():
        raise VidurFormatError(f"{folder}: not a folder")
    path_gpu, path_model = _path_names(root)
    gpu, model = gpu or path_gpu, model or path_model
    if not gpu or not model:
        raise VidurFormatError(f"{folder}: GPU and model not in the path (expected .../compute/<gpu>/<org>/<model>); "
                               "give --gpu and --model")
    dense, shape, vocabs = read_mlp(root / "mlp.csv")
    attention, settings = read_attention(root / "attention.csv")
    degrees = sorted(set(dense) & set(attention))
    if not degrees:
        raise VidurFormatError(f"{root}: mlp.csv and attention.csv share no tensor-parallel degree "
                               f"(mlp.csv: {_listed(dense)}, attention.csv: {_listed(attention)})")
    tp = {d: TPTables(dense[d], {}, attention[d]) for d in degrees}
    vocab_by_tp = {d: vocabs[d] for d in degrees}
    vocab = vocab_by_tp[degrees[0]]
    unpadded = model_vocab(shape, set(vocab_by_tp.values()))
    name = name or default_name(gpu, model)
    licence_file = import_files.find_up(root, "LICENSE", 7)
    sources_file = import_files.find_up(root, "SOURCES.md", 7)
    licence = "unknown"
    if licence_file is not None:
        licence = f"{import_files.licence_summary(licence_file.read_text())}; see {name}.LICENSE"
    provenance = {
        "source": (import_files.first_paragraph(sources_file.read_text()) if sources_file else "")
        or f"Vidur profiling CSVs (microsoft/vidur data/profiling layout) in {root}",
        "gpu": f"NVIDIA {gpu.upper()} (Vidur's '{gpu}' profile)",
        "hardware": gpu.upper(),
        "engine": "Vidur (sarathi-serve / vLLM kernels)",
        "profiler": f"Vidur attention and MLP profilers, {settings.get('attention_backend', '?')}",
        "date": "not recorded by Vidur's CSVs (see the source's commit)",
        "licence": licence,
        "attribution": f"{name}.SOURCES.md" if sources_file else "",
        "measurement": f"median of Vidur's repetitions, milliseconds converted to seconds, one decoder layer "
        f"(per-layer times are multiplied by the model's layers), KV block size {settings.get('block_size', '?')}, "
        f"max_model_len {settings.get('max_model_len', '?')}",
        "imported_by": "kvsim calibrate --import (Vidur format)",
        "notes": "no LM head or sampler (Vidur does not profile them); no mixed chunk + decode points (Vidur "
        "adds the two kernels' times, and so does the profiled model)"
        + (f"; tensor-parallel degrees {_listed(degrees)} only (no degree 1 in both files: a run at another "
           "degree is refused)" if 1 not in degrees else "")
        + (f"; vocab_size {vocab} is the vocabulary Vidur's profiler ran, the model's {unpadded} padded "
           "(Vidur's model config)" if unpadded is not None else "")
        + (f"; vocabularies differ by degree ({', '.join(f'tp{d} {v}' for d, v in vocab_by_tp.items())})"
           if len(set(vocab_by_tp.values())) > 1 else ""),
    }
    model_info = {"name": model, "variant": "fp16", "architecture": "llama",
                  "num_heads": shape["n_head"], "num_kv_heads": shape["n_kv_head"],
                  "ffn_size": shape["n_expanded_embd"], "vocab_size": vocab}
    if unpadded is not None:
        model_info["unpadded_vocab_size"] = unpadded
    if len(set(vocab_by_tp.values())) > 1:
        model_info["vocab_size_by_tp"] = vocab_by_tp
    profile = OperatorProfile(name, provenance, model_info, dict(PER_LAYER), PER_STEP, TP_STABLE, tp)
    return profile, licence_file, sources_file


def import_vidur(folder: str | Path, out_dir: str | Path = PROFILES_DIR, name: str | None = None,
                 gpu: str | None = None, model: str | None = None) -> Path:
    """Convert ``folder`` and write ``<out_dir>/<name>.yaml`` plus its licence and attribution."""
    profile, licence_file, sources_file = convert_vidur(folder, name, gpu, model)
    return import_files.write_with_sources(profile, out_dir, licence_file, sources_file)
