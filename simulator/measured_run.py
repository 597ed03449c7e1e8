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
the file (and line) and what is wrong. ``kvsim validate`` (:mod:`simulator.validate`) replays it.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from kvsim.simulator.config import check_name
from kvsim.simulator.cost_model.catalogue import GPUS, MODELS


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
            rows.append(row)
    if not rows:
        raise ValidateError(f"{path}: no requests")
    df = pd.DataFrame(rows)
    return df.sort_values("queued_ts", kind="stable").reset_index(drop=True)


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
            raise ValidateError(f"{path}:{bad[0] + 2}: column {c!r} is not a number: {df[c].iloc[bad[0]]!r}")
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
    """What the measured engine ran with (read from meta.json; ``None``: not recorded)."""

    model: str
    gpu_name: str
    block_size: int
    num_gpu_blocks: int | None
    max_num_batched_tokens: int
    max_num_seqs: int
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


def _section(meta: dict, *keys: str) -> dict:
    node: Any = meta
    for k in keys:
        node = node.get(k) if isinstance(node, dict) else None
    return node if isinstance(node, dict) else {}


def _pick(where: str, key: str, *values: Any, kind: type = int, required: bool = True) -> Any:
    """The first recorded value (not None) of a setting, checked for type."""
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
    if required:
        raise ValidateError(f"{where}: {key}: not recorded (needed to replay the run)")
    return None


HF_SHAPE_KEYS = {  # ModelShapeConfig key -> Hugging Face config key
    "num_layers": "num_hidden_layers", "hidden_size": "hidden_size", "num_heads": "num_attention_heads",
    "num_kv_heads": "num_key_value_heads", "head_dim": "head_dim", "intermediate_size": "intermediate_size",
    "vocab_size": "vocab_size", "context_len_tokens": "max_position_embeddings",
}


def engine_settings(meta: dict, where: str = "meta.json") -> EngineSettings:
    """The settings a replay needs, from meta.json's top level, ``kv_cache``, ``engine_kwargs``
    and ``resolved_config`` (vLLM's resolved config wins where both record a value)."""
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
            break
    threshold = _pick(where, "scheduler_config.long_prefill_token_threshold",
                      sched.get("long_prefill_token_threshold"), required=False)
    partial = _pick(where, "scheduler_config.max_num_partial_prefills", sched.get("max_num_partial_prefills"),
                    required=False)
    return EngineSettings(
        model=_pick(where, "model", meta.get("model"), mc.get("model"), kw.get("model"), kind=str),
        gpu_name=_pick(where, "hardware.device_name", hw.get("device_name"), kind=str),
        block_size=_pick(where, "kv_cache.block_size", cache.get("block_size"), kv.get("block_size")),
        num_gpu_blocks=_pick(where, "kv_cache.num_gpu_blocks", kv.get("num_gpu_blocks"), cache.get("num_gpu_blocks"),
                             required=False),
        max_num_batched_tokens=_pick(where, "max_num_batched_tokens", sched.get("max_num_batched_tokens"),
                                     kw.get("max_num_batched_tokens")),
        max_num_seqs=_pick(where, "max_num_seqs", sched.get("max_num_seqs"), kw.get("max_num_seqs")),
        max_model_len=_pick(where, "max_model_len", mc.get("max_model_len"), kw.get("max_model_len"),
                            required=False),
        prefix_caching=_pick(where, "enable_prefix_caching", cache.get("enable_prefix_caching"),
                             kv.get("enable_prefix_caching"), kind=bool),
        chunked_prefill=_pick(where, "scheduler_config.enable_chunked_prefill",
                              sched.get("enable_chunked_prefill"), kind=bool, required=False) or False,
        long_prefill_token_threshold=threshold or 0,
        max_num_partial_prefills=partial,
        reserve_full_isl=_pick(where, "scheduler_config.scheduler_reserve_full_isl",
                               sched.get("scheduler_reserve_full_isl"), kind=bool, required=False) is not False,
        tensor_parallel=_pick(where, "tensor_parallel_size", par.get("tensor_parallel_size"),
                              kw.get("tensor_parallel_size"), required=False) or 1,
        dtype=str(_pick(where, "dtype", mc.get("dtype"), kw.get("dtype"), kind=str, required=False) or "auto"),
        gpu_memory_utilization=_pick(where, "gpu_memory_utilization", cache.get("gpu_memory_utilization"),
                                     kv.get("gpu_memory_utilization"), kind=float, required=False) or 0.9,
        model_shape=shape,
    )


def _norm(text: str) -> str:
    return re.sub(r"[^a-z0-9.]", "", text.lower())


def _words(text: str) -> set[str]:
    return set(re.findall(r"[a-z0-9]+", text.lower()))


def gpu_key(device_name: str) -> str | None:
    """The catalogue GPU a device name is (``NVIDIA GeForce RTX 4090`` -> ``rtx4090``,
    ``NVIDIA A100-SXM4-80GB`` -> ``a100-80gb``): the entry whose key or name is in the device
    name, written together or as words; the most specific (longest) one wins."""
    dev, words = _norm(device_name), _words(device_name)
    found = [(len(_norm(n)), k) for k, spec in GPUS.items() for n in (k, spec.name)
             if _norm(n) in dev or _words(n) <= words]
    return max(found)[1] if found else None


def model_key(model: str) -> str | None:
    """The catalogue model a Hugging Face name is (``meta-llama/Llama-3.1-8B`` -> ``llama-3.1-8b``;
    ``-hf``, ``-chat`` and ``-instruct`` variants have their base model's shape)."""
    base = model.rstrip("/").split("/")[-1].lower()
    for suffix in ("-hf", "-chat", "-instruct"):
        base = base.removesuffix(suffix)
    return base if base in MODELS else None
