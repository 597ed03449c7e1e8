"""A measured serving run on disk: its files read and checked, and the engine settings it records.

The layout is LLMServingSim's vLLM benchmark output (e.g. ``gpu_validation/runs/*/``)::

    meta.json        engine settings: block size and count, batch limits, prefix caching,
                     chunked prefill, TP, dtype, model, GPU (and vLLM's whole resolved config)
    requests.jsonl   per request: input_toks, output_toks and the engine's timestamps
                     (queued_ts, scheduled_ts, first_token_ts, last_token_ts; a monotonic clock)
    timeseries.csv   one row per second: running and waiting requests, KV-cache usage %
    workload file    what the engine was sent (found by meta.json's dataset_path basename in the
                     folder's ``workload/``), with the prompts' token ids

``meta.json``, ``requests.jsonl`` and ``timeseries.csv`` may sit in the folder itself or in its
``vllm/`` subfolder. Anything missing or malformed is a :class:`ValidateError`: one line naming
the file (and line) and what is wrong. ``kvsim validate`` (:mod:`simulator.app.validate`) replays it.

meta.json may record only some settings (the ``hardware``, ``kv_cache`` and ``resolved_config``
sections are optional): :func:`engine_settings` takes each from meta.json, else from a
command-line flag, else from vLLM's own default (:data:`VLLM_DEFAULTS`), and says which
(``EngineSettings.sources``); the few a replay cannot assume (:data:`REQUIRED`, and the GPU)
are left ``None`` for ``simulator.app.validate`` to find in the operator profile or name, all
together, in one error.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from kvsim.simulator.config import check_name
from kvsim.simulator.cost_model.moe import hf_moe_shape


class ValidateError(Exception):
    """A run folder that cannot be validated (missing or malformed file, unknown model or GPU):
    one line naming the file and what is wrong."""



# --- reading a run folder -------------------------------------------------------------------------


@dataclass(frozen=True)
class RunFolder:
    """The files of a measured run, read and checked."""

    path: Path  # the folder given
    name: str  # a plain name for the results folder
    meta: dict
    requests: pd.DataFrame  # measured, in arrival (queued) order
    timeseries: pd.DataFrame
    workload: Path
    files: dict[str, Path]  # meta, requests, timeseries: where each was found


REQUEST_KEYS = ("input_toks", "output_toks", "queued_ts", "first_token_ts", "last_token_ts")
TIMESERIES_COLUMNS = ("t", "running", "waiting", "kv_cache_pct")


def read_run_folder(path: str | Path, workload: str | Path | None = None) -> RunFolder:
    """Read ``meta.json``, ``requests.jsonl``, ``timeseries.csv`` and the workload of a run
    folder (see the module docstring); a missing or malformed file is a ValidateError."""
    path = Path(path)
    if not path.is_dir():
        raise ValidateError(f"{path}: not a folder (expected a run folder with meta.json, requests.jsonl, "
                            "timeseries.csv and the workload)")
    data_dir = next((d for d in (path, path / "vllm") if (d / "meta.json").is_file()), None)
    if data_dir is None:
        raise ValidateError(f"{path}: no meta.json here or in {path / 'vllm'} (a run folder holds meta.json, "
                            "requests.jsonl, timeseries.csv and the workload)")
    files = {"meta": data_dir / "meta.json", "requests": data_dir / "requests.jsonl",
             "timeseries": data_dir / "timeseries.csv"}
    for key in ("requests", "timeseries"):
        if not files[key].is_file():
            raise ValidateError(f"{files[key]}: file not found (a run folder holds meta.json, requests.jsonl and "
                                "timeseries.csv)")
    meta = _read_meta(files["meta"])
    requests = _read_requests(files["requests"])
    timeseries = _read_timeseries(files["timeseries"])
    wl = _find_workload(path, data_dir, meta, files["meta"], workload)
    here = path.resolve()
    name = here.parent.name if data_dir == path and here.name == "vllm" else here.name
    name = re.sub(r"[^A-Za-z0-9._-]", "-", name).lstrip(".-_") or "run"
    check_name(name[:128], "run name")
    return RunFolder(path, name[:128], meta, requests, timeseries, wl, files)


def _read_meta(path: Path) -> dict:
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as e:
        raise ValidateError(f"{path}: cannot read ({e})") from None
    except ValueError as e:
        raise ValidateError(f"{path}: not valid JSON ({e})") from None
    if not isinstance(meta, dict):
        raise ValidateError(f"{path}: expected a JSON object of run metadata, got {type(meta).__name__}")
    return meta


def _read_requests(path: Path) -> pd.DataFrame:
    rows = []
    with open(path, encoding="utf-8", errors="replace") as f:
        for line_no, text in enumerate(f, 1):
            if not text.strip():
                continue
            try:
                obj = json.loads(text)
            except ValueError as e:
                raise ValidateError(f"{path}:{line_no}: not valid JSON ({e})") from None
            if not isinstance(obj, dict):
                raise ValidateError(f"{path}:{line_no}: expected a JSON object, got {type(obj).__name__}")
            missing = [k for k in REQUEST_KEYS if k not in obj]
            if missing:
                raise ValidateError(f"{path}:{line_no}: missing key {', '.join(map(repr, missing))} (each line "
                                    f"needs {', '.join(REQUEST_KEYS)})")
            row = {}
            for k in REQUEST_KEYS:
                v = obj[k]
                if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                    raise ValidateError(f"{path}:{line_no}: {k} is not a finite number: {v!r}")
                row[k] = float(v)
            scheduled = obj.get("scheduled_ts")  # optional: when the engine first scheduled it
            ok = isinstance(scheduled, (int, float)) and not isinstance(scheduled, bool) and math.isfinite(scheduled)
            row["scheduled_ts"] = float(scheduled) if ok else math.nan
            if row["input_toks"] < 1 or row["output_toks"] < 1:
                raise ValidateError(f"{path}:{line_no}: input_toks and output_toks must be >= 1")
            if not row["queued_ts"] <= row["first_token_ts"] <= row["last_token_ts"]:
                raise ValidateError(f"{path}:{line_no}: timestamps out of order (queued_ts <= first_token_ts <= "
                                    "last_token_ts expected)")
            row["line"] = line_no
            row["request_id"] = str(obj.get("request_id", ""))
            rows.append(row)
    if not rows:
        raise ValidateError(f"{path}: no requests")
    df = pd.DataFrame(rows)
    return df.iloc[np.lexsort((df["queued_ts"].to_numpy(), request_order(df["request_id"])))].reset_index(drop=True)


def request_order(ids: pd.Series) -> np.ndarray:
    """The order the benchmark sent the requests in, when their ids say it: every id ends in
    a number (``bench-17``) and no two share it. Otherwise zeros, and the engine's queueing
    order (``queued_ts``) decides; with several engines (data parallel) near-simultaneous
    arrivals can be queued out of order there, which ``simulator.app.validate`` tolerates."""
    numbers = ids.str.extract(r"(\d+)$", expand=False)
    if numbers.isna().any() or numbers.duplicated().any():
        return np.zeros(len(ids), np.int64)
    return numbers.astype(np.int64).to_numpy()


def _read_timeseries(path: Path) -> pd.DataFrame:
    try:
        df = pd.read_csv(path)
    except (ValueError, pd.errors.ParserError, pd.errors.EmptyDataError) as e:
        raise ValidateError(f"{path}: not a readable CSV ({' '.join(str(e).split())})") from None
    missing = [c for c in TIMESERIES_COLUMNS if c not in df.columns]
    if missing:
        raise ValidateError(f"{path}: missing column {', '.join(map(repr, missing))} (expected "
                            f"{', '.join(TIMESERIES_COLUMNS)})")
    for c in [*TIMESERIES_COLUMNS, *(["preempted"] if "preempted" in df.columns else [])]:
        values = pd.to_numeric(df[c], errors="coerce")
        bad = np.flatnonzero(~np.isfinite(values.to_numpy(float)))
        if len(bad):
            cell = df[c].iloc[int(bad[0])]
            cell = cell.item() if isinstance(cell, np.generic) else cell  # 'inf', not np.float64(inf)
            raise ValidateError(f"{path}:{int(bad[0]) + 2}: column {c!r} is not a number: {cell!r}")
        df[c] = values
    if not len(df):
        raise ValidateError(f"{path}: no rows")
    return df


def _find_workload(path: Path, data_dir: Path, meta: dict, meta_path: Path, given: str | Path | None) -> Path:
    if given is not None:
        given = Path(given)
        if not given.is_file():
            raise ValidateError(f"--workload {given}: file not found")
        return given
    dataset = meta.get("dataset_path")
    if not isinstance(dataset, str) or not dataset.strip():
        raise ValidateError(f"{meta_path}: dataset_path: missing; give the workload file with --workload")
    base = Path(dataset).name
    roots = [path / "workload", data_dir.parent / "workload", path, data_dir]
    for root in dict.fromkeys(roots):
        if (root / base).is_file():
            return root / base
    looked = ", ".join(str(r / base) for r in dict.fromkeys(roots))
    raise ValidateError(f"{meta_path}: dataset_path {dataset!r}: workload file not found (looked in {looked}); "
                        "give it with --workload")


# --- engine settings ------------------------------------------------------------------------------


@dataclass(frozen=True)
class EngineSettings:
    """What the measured engine ran with: read from meta.json, else given on the command line,
    else a documented default (``None``: not known yet; :func:`missing_settings` names the
    ones a replay cannot do without). ``sources`` says where each value that meta.json does
    not record came from."""

    model: str
    gpu_name: str | None
    block_size: int | None
    num_gpu_blocks: int | None
    max_num_batched_tokens: int | None
    max_num_seqs: int | None
    max_model_len: int | None
    prefix_caching: bool
    chunked_prefill: bool
    long_prefill_token_threshold: int
    max_num_partial_prefills: int | None
    reserve_full_isl: bool
    tensor_parallel: int
    dtype: str
    gpu_memory_utilization: float
    model_shape: dict | None  # the model's shape from the resolved config, when it records one
    data_parallel: int = 1  # engines behind vLLM's front end, each with its own KV pool
    expert_parallel: bool = False  # a MoE model's experts split whole over the engines' GPUs
    sources: dict[str, str] = field(default_factory=dict, compare=False)  # setting -> where from (not meta.json)


SETTING_KEYS = {  # EngineSettings field -> its name in meta.json (for messages)
    "gpu_name": "hardware.device_name", "block_size": "kv_cache.block_size",
    "num_gpu_blocks": "kv_cache.num_gpu_blocks", "max_num_batched_tokens": "max_num_batched_tokens",
    "max_num_seqs": "max_num_seqs", "max_model_len": "max_model_len", "prefix_caching": "enable_prefix_caching",
    "long_prefill_token_threshold": "scheduler_config.long_prefill_token_threshold",
    "reserve_full_isl": "scheduler_config.scheduler_reserve_full_isl", "tensor_parallel": "tensor_parallel_size",
    "data_parallel": "data_parallel_size", "expert_parallel": "enable_expert_parallel", "dtype": "dtype", "gpu_memory_utilization": "gpu_memory_utilization",
}

FLAGS = {  # EngineSettings field -> the ``kvsim validate`` option that gives it
    "gpu_name": "--gpu", "block_size": "--block-size", "num_gpu_blocks": "--num-gpu-blocks",
    "max_num_batched_tokens": "--max-num-batched-tokens", "max_num_seqs": "--max-num-seqs",
    "max_model_len": "--max-model-len", "prefix_caching": "--prefix-caching", "tensor_parallel": "--tensor-parallel",
    "data_parallel": "--data-parallel", "expert_parallel": "--expert-parallel",
}

REQUIRED = ("block_size", "max_num_batched_tokens", "max_num_seqs")
"""Settings a replay cannot assume (besides the GPU, which ``simulator.app.validate`` resolves to a
catalogue entry): without them, from meta.json, the profile or a flag, it refuses."""

VLLM_DEFAULTS: dict[str, tuple[Any, str]] = {
    "prefix_caching": (True, "vLLM's default (the V1 engine caches prefixes unless told not to)"),
    "long_prefill_token_threshold": (0, "vLLM's default (no cap on a request's tokens per step)"),
    "reserve_full_isl": (True, "vLLM 0.19's default (scheduler_reserve_full_isl)"),
    "tensor_parallel": (1, "vLLM's default (tensor_parallel_size 1)"),
    "data_parallel": (1, "vLLM's default (data_parallel_size 1)"),
    "expert_parallel": (False, "vLLM's default (enable_expert_parallel false)"),
    "dtype": ("auto", "vLLM's default (the model's own dtype)"),
    "gpu_memory_utilization": (0.9, "vLLM's default"),
}
"""Settings a run folder may leave out: vLLM's own default is what the engine ran with."""


def _section(meta: dict, *keys: str) -> dict:
    node: Any = meta
    for k in keys:
        node = node.get(k) if isinstance(node, dict) else None
    return node if isinstance(node, dict) else {}


def _pick(where: str, key: str, *values: Any, kind: type = int) -> Any:
    """The first recorded value (not None) of a setting, checked for type (None: none recorded)."""
    for v in values:
        if v is None:
            continue
        if kind is bool:
            if not isinstance(v, bool):
                raise ValidateError(f"{where}: {key}: expected true or false, got {v!r}")
            return v
        if kind is int and (isinstance(v, bool) or not isinstance(v, int) or v < 0):
            raise ValidateError(f"{where}: {key}: expected an integer >= 0, got {v!r}")
        if kind is float and (isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v <= 1):
            raise ValidateError(f"{where}: {key}: expected a number in (0, 1], got {v!r}")
        if kind is str and not isinstance(v, str):
            raise ValidateError(f"{where}: {key}: expected a string, got {v!r}")
        return v
    return None


HF_SHAPE_KEYS = {  # ModelShapeConfig key -> Hugging Face config key
    "num_layers": "num_hidden_layers", "hidden_size": "hidden_size", "num_heads": "num_attention_heads",
    "num_kv_heads": "num_key_value_heads", "head_dim": "head_dim", "intermediate_size": "intermediate_size",
    "vocab_size": "vocab_size", "context_len_tokens": "max_position_embeddings",
}


def engine_settings(meta: dict, where: str = "meta.json", given: dict[str, Any] | None = None) -> EngineSettings:
    """The settings a replay needs, from ``given`` (command-line flags: EngineSettings field ->
    value, they win), meta.json's top level, ``kv_cache``, ``engine_kwargs``, ``hardware`` and
    ``resolved_config`` (vLLM's resolved config wins where both record a value), then
    :data:`VLLM_DEFAULTS`. A setting none of them has is None (see :func:`missing_settings`)."""
    rc = _section(meta, "resolved_config")
    cache, sched = _section(rc, "cache_config"), _section(rc, "scheduler_config")
    par, mc = _section(rc, "parallel_config"), _section(rc, "model_config")
    kv, kw, hw = _section(meta, "kv_cache"), _section(meta, "engine_kwargs"), _section(meta, "hardware")
    shape = None
    for key in ("hf_text_config", "hf_config"):  # a dict when the recorder could serialise it
        hf = mc.get(key)
        if isinstance(hf, dict) and all(hf.get(v) is not None for k, v in HF_SHAPE_KEYS.items()
                                        if k not in ("num_kv_heads", "head_dim")):
            shape = {k: hf[v] for k, v in HF_SHAPE_KEYS.items() if hf.get(v) is not None}
            act = str(hf.get("hidden_act", "silu")).lower()
            shape["gated_ffn"] = act in ("silu", "swiglu", "gelu_pytorch_tanh") or "gate" in act
            try:
                moe = hf_moe_shape(hf)
            except ValueError as e:
                raise ValidateError(f"{where}: resolved_config.model_config.{key}: {e}") from None
            if moe is not None:
                shape["moe"] = moe
            break
    given = {k: v for k, v in (given or {}).items() if v is not None}
    sources: dict[str, str] = {}

    def pick(name: str, *values: Any, kind: type = int) -> Any:
        if name in given:
            sources[name] = FLAGS.get(name, name)
            return given[name]
        v = _pick(where, SETTING_KEYS.get(name, name), *values, kind=kind)
        if v is None and name in VLLM_DEFAULTS:
            v, sources[name] = VLLM_DEFAULTS[name]
        return v

    model = _pick(where, "model", meta.get("model"), mc.get("model"), kw.get("model"), kind=str)
    if model is None:
        raise ValidateError(f"{where}: model: not recorded (needed to replay the run)")
    partial = _pick(where, "scheduler_config.max_num_partial_prefills", sched.get("max_num_partial_prefills"))
    return EngineSettings(
        model=model,
        gpu_name=pick("gpu_name", hw.get("device_name"), kind=str),
        block_size=pick("block_size", cache.get("block_size"), kv.get("block_size"), kw.get("block_size")),
        num_gpu_blocks=pick("num_gpu_blocks", kv.get("num_gpu_blocks"), cache.get("num_gpu_blocks"),
                            kw.get("num_gpu_blocks_override")),
        max_num_batched_tokens=pick("max_num_batched_tokens", sched.get("max_num_batched_tokens"),
                                    kw.get("max_num_batched_tokens")),
        max_num_seqs=pick("max_num_seqs", sched.get("max_num_seqs"), kw.get("max_num_seqs")),
        max_model_len=pick("max_model_len", mc.get("max_model_len"), kw.get("max_model_len")),
        prefix_caching=pick("prefix_caching", cache.get("enable_prefix_caching"), kv.get("enable_prefix_caching"),
                            kw.get("enable_prefix_caching"), kind=bool),
        chunked_prefill=_pick(where, "scheduler_config.enable_chunked_prefill", sched.get("enable_chunked_prefill"),
                              kw.get("enable_chunked_prefill"), kind=bool) or False,
        long_prefill_token_threshold=pick("long_prefill_token_threshold", sched.get("long_prefill_token_threshold"),
                                          kw.get("long_prefill_token_threshold")),
        max_num_partial_prefills=partial,
        reserve_full_isl=pick("reserve_full_isl", sched.get("scheduler_reserve_full_isl"), kind=bool),
        tensor_parallel=pick("tensor_parallel", par.get("tensor_parallel_size"), kw.get("tensor_parallel_size")) or 1,
        dtype=str(pick("dtype", mc.get("dtype"), kw.get("dtype"), kind=str)),
        gpu_memory_utilization=pick("gpu_memory_utilization", cache.get("gpu_memory_utilization"),
                                    kv.get("gpu_memory_utilization"), kw.get("gpu_memory_utilization"), kind=float),
        model_shape=shape,
        data_parallel=pick("data_parallel", par.get("data_parallel_size"), kw.get("data_parallel_size")) or 1,
        expert_parallel=bool(pick("expert_parallel", par.get("enable_expert_parallel"),
                                  kw.get("enable_expert_parallel"), kind=bool)),
        sources=sources,
    )


def missing_settings(s: EngineSettings) -> list[str]:
    """The settings a replay needs that are still unknown, each with the option that gives it."""
    return [f"{SETTING_KEYS[k]} (give {FLAGS[k]} N)" for k in REQUIRED if getattr(s, k) is None]
