"""``kvsim validate``: replay a measured serving run and compare the simulation with it.

A run folder (:mod:`simulator.app.measured_run`: meta.json, requests.jsonl, timeseries.csv and the
workload with token ids) holds what a real engine did. The replay uses the engine settings the
run records, its measured KV block count and a chosen cost model; nothing is fitted to the
measured latencies. It runs under ``vllm-v1`` (when kvsim has it) and ``vllm-v0``, side by side,
plus the roofline for reference; :mod:`simulator.app.validate_report` writes the report.

Definitions (the same on both sides, so a difference is the simulator's):

- latencies from when the engine queued the request (``queued_ts``; simulated: its arrival):
  TTFT = first token - queued, E2E = last token - queued, TPOT = (last - first) /
  (output tokens - 1) for requests of more than one output token;
- percentiles: numpy's default (linear interpolation between order statistics);
- makespan: last token of any request - first request queued; throughput: output tokens (or
  requests) / makespan;
- the simulated time axis starts at the first arrival (the workload loader rebases it to 0);
- per-second curves: the measurement keeps, for each second ``[t - 1, t)`` of its clock, the
  last engine iteration's running / waiting counts and KV usage, and skips seconds without an
  iteration. The simulation is sampled the same way: steps are bucketed by their end time, the
  last step of each second gives the state it was scheduled with (running and waiting requests
  after admission, KV blocks held / blocks). Before a curve is compared, a skipped second
  carries the last value and the time after a run's last sample reads 0 (the engine is empty).
  With several engines (data parallel) the simulated engines are sampled one by one and added.

What a replay may not do: reject or abort a request the engine served (its settings are not
the run's; the replay is refused, saying why). What the report says instead of guessing: a
measured metric the run did not record is "not recorded", never a missed target; a replay that
fails is listed as failed, and the other replays are still reported; every engine setting the
run folder does not record is listed with the value used and where it came from.
"""

from __future__ import annotations

import math
import re
import time
import warnings
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from kvsim.simulator.app.measured_run import (
    SETTING_KEYS,
    EngineSettings,
    RunFolder,
    ValidateError,
    engine_settings,
    missing_settings,
    read_run_folder,
)
from kvsim.simulator.config import (
    SCHEDULER_POLICIES,
    ConfigError,
    ExperimentConfig,
    validate_config,
)
from kvsim.simulator.cost_model.catalogue import GPUS, MODELS
from kvsim.simulator.cost_model.import_files import DEFAULT_OUT_DIR
from kvsim.simulator.cost_model.profile_names import gpu_key, model_key, profile_name
from kvsim.simulator.engine.memory_classes import FREE_CLASSES

UNQUEUED_S = 0.05
"""A request scheduled within this many seconds of being queued did not wait in the queue."""

POLICIES = ("vllm-v1", "vllm-v0")
"""Scheduling policies a validation replays, in report order."""

COST_MODELS = ("profiled", "roofline")

PERCENTILES = (50, 90, 99)

LATENCIES = (("ttft", "TTFT", "s", 1.0), ("tpot", "TPOT", "ms", 1e3), ("e2e", "E2E", "s", 1.0))
"""(key, label, unit, factor from seconds) of each latency the report compares."""



def policy_available(policy: str) -> bool:
    """Whether this kvsim's config accepts ``scheduler.policy: <policy>`` (``vllm-v0`` is the
    paper's scheduler, always there; ``vllm-v1`` arrives with its own issue)."""
    return policy in SCHEDULER_POLICIES


def default_profile(gpu: str, model: str) -> str | None:
    """The operator profile measured on this GPU for this model, by the name ``kvsim calibrate
    --import`` gives it (``cost_model.profile_names.profile_name``): a shipped one (its name),
    else one imported into the importer's default folder, ``results/profiles`` (its path)."""
    from kvsim.simulator.cost_model import operator_profile

    name = profile_name(gpu, model)
    if (operator_profile.PROFILES_DIR / f"{name}.yaml").is_file():
        return name
    imported = DEFAULT_OUT_DIR / f"{name}.yaml"
    return str(imported) if imported.is_file() else None


DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "half": 2, "auto": 2, "float32": 4, "float": 4}


@dataclass
class ReplayPlan:
    """How a run is replayed: the settings, the resolved names, and what the report must say."""

    settings: EngineSettings
    model: dict  # the config's model section
    gpu: str
    num_gpu_blocks: int | None  # hardware.num_gpu_blocks of every replay: the run's (less the null block) or computed
    cost_model: str
    profile: str | None
    notes: list[str] = field(default_factory=list)
    #: (setting, value, where it came from) of every value the run folder does not record
    assumed: list[tuple[str, str, str]] = field(default_factory=list)


def _profile_meta(profile: str) -> tuple[str | None, int | None, str]:
    """(GPU device name, KV block size, profile name) an operator profile records about how it
    was measured (provenance ``gpu`` and ``measurement``'s "KV block size N")."""
    from kvsim.simulator.cost_model.operator_profile import (
        find_operator_profile,
        read_operator_profile,
    )

    try:
        prof = read_operator_profile(find_operator_profile(profile))
    except ValueError as e:  # OperatorProfileError: named in the replay's error later
        raise ValidateError(str(e)) from None
    m = re.search(r"KV block size (\d+)", prof.provenance.get("measurement", ""))
    return prof.provenance.get("gpu") or None, int(m.group(1)) if m else None, prof.name


def plan_replay(folder: RunFolder, *, cost_model: str = "profiled", profile: str | None = None,
                gpu: str | None = None, model: str | None = None,
                given: dict[str, Any] | None = None) -> ReplayPlan:
    """Resolve the model, GPU, profile, KV capacity and engine settings of a replay: from the
    run's meta.json, else a flag (``given``: EngineSettings field -> value; ``gpu``, ``model``,
    ``profile``), else the operator profile's own record (GPU, block size), else the model's
    context window (max_model_len) or vLLM's defaults. Every setting still unknown is named in
    one error, each with the option that gives it."""
    where = str(folder.files["meta"])
    s = engine_settings(folder.meta, where, given)
    assumed = [(SETTING_KEYS.get(k, k), _plain(getattr(s, k)), src) for k, src in s.sources.items()]
    notes: list[str] = []
    problems: list[str] = []
    if cost_model not in COST_MODELS:
        raise ValidateError(f"--cost-model {cost_model}: choose one of {', '.join(COST_MODELS)}")
    if gpu is not None:
        if gpu.lower() not in GPUS:
            raise ValidateError(f"--gpu {gpu}: unknown GPU; choose one of {', '.join(GPUS)}")
        gpu = gpu.lower()
        if s.gpu_name is None:
            assumed.append(("hardware.device_name", gpu, "--gpu"))
    elif s.gpu_name is not None:
        gpu = gpu_key(s.gpu_name)
        if gpu is None:
            problems.append(f"hardware.device_name {s.gpu_name!r} is no GPU in kvsim's catalogue; give --gpu NAME "
                            f"(one of {', '.join(GPUS)})")
    if model and model.lower() not in MODELS:
        raise ValidateError(f"--model {model}: unknown model; choose one of {', '.join(MODELS)}")
    key = model.lower() if model else model_key(s.model)
    dtype = s.dtype.removeprefix("torch.").lower()
    if key is not None:
        model_section: dict = {"name": key}
        spec_len = MODELS[key].max_seq_len
        if MODELS[key].dtype_bytes != DTYPE_BYTES.get(dtype, 2):
            notes.append(f"The run's dtype {dtype} differs from the catalogue's {MODELS[key].dtype_bytes}-byte "
                         "weights; the catalogue's are used.")
    elif s.model_shape is not None:
        model_section = {"name": re.sub(r"[^A-Za-z0-9._-]", "-", s.model.split("/")[-1]),
                         "shape": {**s.model_shape, "dtype_bytes": DTYPE_BYTES.get(dtype, 2)}}
        spec_len = s.model_shape.get("context_len_tokens")
        notes.append(f"{s.model} is not in kvsim's catalogue: its shape is read from the run's resolved "
                     "config (model_config.hf_config).")
    else:
        raise ValidateError(f"{where}: model {s.model!r} is not in kvsim's catalogue and the run's resolved config "
                            f"records no shape (model_config.hf_config); give --model NAME (one of {', '.join(MODELS)})")
    if cost_model == "profiled" and profile is None and gpu is not None:
        profile = default_profile(gpu, key or model_section["name"])
    if cost_model == "profiled" and profile is not None:
        device, block, name = _profile_meta(profile)
        if gpu is None and s.gpu_name is None and device and gpu_key(device):
            gpu = gpu_key(device)
            assumed.append(("hardware.device_name", f"{device} ({gpu})", f"operator profile {name} (provenance.gpu)"))
        if s.block_size is None and block is not None:
            s = replace(s, block_size=block)
            assumed.append(("kv_cache.block_size", str(block), f"operator profile {name} (the block size its "
                            "attention was measured with)"))
    if gpu is None and s.gpu_name is None:
        problems.append(f"hardware.device_name (give --gpu NAME, one of {', '.join(GPUS)})")
    problems += missing_settings(s)
    if cost_model == "profiled" and profile is None and gpu is not None:
        problems.append(f"no shipped operator profile for {gpu} + {key or s.model} (looked for "
                        f"{profile_name(gpu, key or model_section['name'])}, shipped or in "
                        f"{DEFAULT_OUT_DIR}): give --profile NAME or PATH (kvsim calibrate --import "
                        "writes one), or --cost-model roofline")
    if problems:
        raise ValidateError(f"{where}: cannot replay this run: " + "; ".join(problems))
    assert gpu is not None and s.block_size is not None
    if cost_model == "roofline":
        profile = None
    if s.num_gpu_blocks is not None:
        if s.num_gpu_blocks < 2:
            raise ValidateError(f"{where}: kv_cache.num_gpu_blocks {s.num_gpu_blocks}: fewer than 2 blocks")
        blocks = s.num_gpu_blocks - 1
        notes.append(f"KV capacity: the run's {s.num_gpu_blocks:,} blocks minus 1, {blocks:,} blocks of "
                     f"{s.block_size} tokens: vLLM's block pool keeps one block as the null block, never "
                     "given to a request.")
    else:
        blocks = _computed_blocks(folder, s, model_section, gpu)
        notes.append("KV capacity: meta.json does not record num_gpu_blocks, so it is computed as vLLM does "
                     f"(GPU memory x gpu_memory_utilization {s.gpu_memory_utilization:g} - weights - activation "
                     f"reserve at the run's token budget, simulator/capacity.py): {blocks:,} blocks of "
                     f"{s.block_size} tokens; the report's capacity is that computed value.")
    max_len = s.max_model_len
    if max_len is None and spec_len:
        max_len = spec_len
        why = "the model's context window (vLLM's max_model_len when none is set: max_position_embeddings)"
        if max_len > blocks * s.block_size:  # vLLM refuses to start with a window its cache cannot hold
            max_len = blocks * s.block_size
            why = (f"the model's context window {spec_len:,}, capped at the KV cache's {max_len:,} tokens (vLLM "
                   "refuses a window its KV cache cannot hold, so the run's was at most that)")
        assumed.append(("max_model_len", str(max_len), why))
    if max_len is not None:
        model_section["context_len_tokens"] = max_len
    if s.data_parallel > 1:
        notes.append(f"Data parallel: {s.data_parallel} engines, each with its own KV pool of that many blocks; "
                     "arrivals go to the engine with "
                     "the fewest outstanding tokens (router least_outstanding_tokens), as vLLM's front end sends "
                     "each to its least-loaded engine. The simulated per-second curves add the engines' running "
                     "and waiting requests and average their KV usage.")
    return ReplayPlan(s, model_section, gpu, blocks, cost_model, profile, notes, assumed)


def parallel_hardware(s: EngineSettings) -> dict:
    """The ``hardware`` keys of the run's parallelism: ``tensor_parallel`` GPUs an engine; with
    ``data_parallel_size`` > 1 that many engines of one deployment (each its own KV pool; a MoE
    model's expert layers span all their GPUs, so its weights per GPU and its collectives follow);
    ``enable_expert_parallel``: whole experts per GPU."""
    keys: dict = {"tensor_parallel": s.tensor_parallel}
    if s.data_parallel > 1:
        keys |= {"num_replicas": s.data_parallel, "data_parallel": True}
    if s.expert_parallel:
        keys["expert_parallel"] = True
    return keys


def _computed_blocks(folder: RunFolder, s: EngineSettings, model_section: dict, gpu: str) -> int:
    """KV blocks per engine as vLLM sizes its cache (``ExperimentConfig.memory_budget``) for the
    run's model, GPU, parallelism, memory share and batch limits: one number for every replay,
    so vllm-v0's whole-prompt token budget does not shrink its cache."""
    probe = {
        "model": {k: v for k, v in model_section.items() if k != "context_len_tokens"} | {"context_len_tokens": 1},
        "hardware": {"gpu": gpu, **parallel_hardware(s), "gpu_memory_utilization": s.gpu_memory_utilization},
        "scheduler": {"max_num_seqs": s.max_num_seqs, "max_num_batched_tokens": s.max_num_batched_tokens},
        "allocator": {"block_size": s.block_size},
        "workload": {"arrivals": {"kind": "poisson", "rate": 1},
                     "lengths": {"kind": "fixed", "prompt_tokens": 1, "output_tokens": 1}, "num_requests": 1},
    }
    try:
        return validate_config(probe, source=f"KV capacity of {folder.name}").memory_budget.num_gpu_blocks
    except ConfigError as e:
        raise ValidateError(str(e)) from None


def _plain(value: Any) -> str:
    """A setting's value as the report prints it (true/false, plain numbers)."""
    if isinstance(value, bool):
        return str(value).lower()
    return str(value)


def replay_config(folder: RunFolder, plan: ReplayPlan, policy: str, cost_model: str | None = None,
                  overrides: list[str] | tuple[str, ...] = ()) -> ExperimentConfig:
    """The kvsim experiment that replays ``folder`` under ``policy`` (vllm-v1 or vllm-v0)."""
    s = plan.settings
    kind = cost_model or plan.cost_model
    hardware: dict = {"gpu": plan.gpu, **parallel_hardware(s), "swap_space_gib": 0}
    if plan.num_gpu_blocks is not None:
        hardware["num_gpu_blocks"] = plan.num_gpu_blocks
    else:
        hardware["gpu_memory_utilization"] = s.gpu_memory_utilization
    scheduler: dict = {"max_num_seqs": s.max_num_seqs}
    if s.data_parallel > 1:  # one engine per replica, each its own KV pool (ReplayPlan's notes)
        scheduler["router"] = "least_outstanding_tokens"
    allocator: dict = {"block_size": s.block_size, "prefix_caching": s.prefix_caching}
    context = plan.model.get("context_len_tokens")
    if policy == "vllm-v1":
        scheduler.update(policy="vllm-v1", max_num_batched_tokens=s.max_num_batched_tokens,
                         long_prefill_token_threshold=s.long_prefill_token_threshold,
                         max_num_partial_prefills=None, reserve_full_isl=s.reserve_full_isl)
    else:
        # v0 without chunked prefill needs a budget of a whole prompt (vLLM v0 refuses a smaller one).
        budget = max(s.max_num_batched_tokens, context or 0)
        scheduler["max_num_batched_tokens"] = budget
        scheduler["policy"] = "vllm-v0"
    cost: dict = {"kind": kind}
    if kind == "profiled":
        cost["profile"] = plan.profile
    raw = {
        "name": folder.name,
        "model": dict(plan.model),
        "hardware": hardware,
        "workload": {"trace": {"format": "token-ids", "path": str(folder.workload.resolve())}},
        "allocator": allocator,
        "scheduler": scheduler,
        "preemption": {"mode": "recompute"},
        "cost_model": cost,
        "engine": {"macro_steps": False},  # one step row per iteration: the per-second curves need them
    }
    try:
        return validate_config(raw, source=f"replay of {folder.name} ({policy})", overrides=list(overrides))
    except ConfigError as e:
        raise ValidateError(str(e)) from None


# --- measured and simulated numbers ---------------------------------------------------------------


@dataclass
class Latencies:
    """Per request, in arrival order: seconds."""

    ttft: np.ndarray
    tpot: np.ndarray  # NaN for one-token outputs
    e2e: np.ndarray
    output_tokens: np.ndarray
    makespan_s: float


def measured_latencies(requests: pd.DataFrame) -> Latencies:
    q, first, last = (requests[c].to_numpy(float) for c in ("queued_ts", "first_token_ts", "last_token_ts"))
    out = requests["output_toks"].to_numpy(float)
    with np.errstate(invalid="ignore", divide="ignore"):
        tpot = np.where(out > 1, (last - first) / (out - 1), np.nan)
    return Latencies(first - q, tpot, last - q, out, float(last.max() - q.min()))


def simulated_latencies(requests: pd.DataFrame) -> Latencies:
    """The same quantities from kvsim's request table (rows in request-id = arrival order);
    a request that did not finish (rejected, aborted: ``status``) has NaN latencies."""
    r = requests.sort_values("request_id", kind="stable")
    arrival, first, finish = (r[c].to_numpy(float) for c in ("arrival_s", "first_token_s", "finish_s"))
    if "status" in r:  # a rejected (or aborted) request ends without latencies: never an E2E of 0
        done = (r["status"] == "finished").to_numpy()
        first, finish = np.where(done, first, np.nan), np.where(done, finish, np.nan)
    out = r["output_tokens"].to_numpy(float)
    with np.errstate(invalid="ignore", divide="ignore"):
        tpot = np.where(out > 1, (finish - first) / (out - 1), np.nan)
    makespan = float(np.nanmax(finish) - arrival.min()) if np.isfinite(finish).any() else math.nan
    return Latencies(first - arrival, tpot, finish - arrival, out, makespan)


def latency_stats(lat: Latencies) -> dict[str, float]:
    """Mean and percentiles of each latency (in the report's units), makespan, throughputs."""
    out: dict[str, float] = {}
    for key, _, _, factor in LATENCIES:
        values = getattr(lat, key)
        values = values[np.isfinite(values)] * factor
        out[f"{key}_mean"] = float(values.mean()) if len(values) else math.nan
        for p in PERCENTILES:
            out[f"{key}_p{p}"] = float(np.percentile(values, p)) if len(values) else math.nan
    done = np.isfinite(lat.e2e)
    out["makespan_s"] = lat.makespan_s
    out["output_throughput"] = float(lat.output_tokens[done].sum() / lat.makespan_s) if lat.makespan_s else math.nan
    out["request_throughput"] = float(done.sum() / lat.makespan_s) if lat.makespan_s else math.nan
    return out


CURVES = ("running", "waiting", "kv_pct")


def measured_curves(timeseries: pd.DataFrame) -> pd.DataFrame:
    """The measurement's per-second rows: t (s, the end of the second), running, waiting, kv_pct."""
    t = np.rint(timeseries["t"].to_numpy(float)).astype(int)
    return pd.DataFrame({"t": t, "running": timeseries["running"].to_numpy(float),
                         "waiting": timeseries["waiting"].to_numpy(float),
                         "kv_pct": timeseries["kv_cache_pct"].to_numpy(float)})


def simulated_curves(steps: pd.DataFrame, requests: pd.DataFrame, capacity_slots: int) -> pd.DataFrame:
    """Per-second samples of a simulated run, taken as the measurement takes them (module
    docstring): for each second ``[t - 1, t)`` the last step ending in it, with the requests
    running and waiting as it was scheduled and the share of KV blocks held then.

    ``steps`` must hold one row per iteration (``engine.macro_steps: false``, as the
    replay runs). Running requests = arrived - ended - waiting - swapped at the step's start:
    the step table counts the queues, the request table the arrivals and ends.

    Several engines (data parallel: the ``replica`` columns, each ``capacity_slots`` of KV) are
    sampled one by one, each as above, and then added up second by second (a second one engine
    skipped carries its last value): running and waiting requests are summed, KV usage is the
    engines' mean (equal pools: the share of all their blocks held).
    """
    if "replica" in steps.columns and steps["replica"].nunique() > 1:
        engines = [_engine_curves(steps[steps["replica"] == r], requests[requests["replica"] == r], capacity_slots)
                   for r in sorted(steps["replica"].unique())]
        seconds = np.unique(np.concatenate([c["t"].to_numpy(int) for c in engines]))
        parts = {col: np.array([aligned(c, seconds, col) for c in engines]) for col in CURVES}
        return pd.DataFrame({"t": seconds, "running": parts["running"].sum(axis=0),
                             "waiting": parts["waiting"].sum(axis=0), "kv_pct": parts["kv_pct"].mean(axis=0)})
    return _engine_curves(steps, requests, capacity_slots)


def _engine_curves(steps: pd.DataFrame, requests: pd.DataFrame, capacity_slots: int) -> pd.DataFrame:
    """``simulated_curves`` of one engine."""
    if not len(steps):
        return pd.DataFrame({"t": np.zeros(0, int), **{c: np.zeros(0) for c in CURVES}})
    if (steps["iterations"] > 1).any():
        raise ValueError("per-second curves need one step table row per iteration (engine.macro_steps: false)")
    start = steps["start_s"].to_numpy(float)
    end = start + steps["duration_s"].to_numpy(float)
    arrivals = np.sort(requests["arrival_s"].to_numpy(float))
    ended = requests["finish_s"].to_numpy(float)
    ended = np.sort(np.where(np.isfinite(ended), ended, requests["arrival_s"].to_numpy(float)))  # rejected
    in_system = np.searchsorted(arrivals, start, "right") - np.searchsorted(ended, start, "right")
    waiting = steps["waiting"].to_numpy(float)
    running = in_system - waiting - steps["swapped"].to_numpy(float)
    free = steps[list(FREE_CLASSES)].to_numpy(float).sum(axis=1)
    kv = 100.0 * (1.0 - free / capacity_slots)
    bucket = np.floor(end).astype(int) + 1  # second [t - 1, t) is labelled t
    last = np.flatnonzero(np.r_[bucket[1:] != bucket[:-1], True])  # last step of each second
    return pd.DataFrame({"t": bucket[last], "running": running[last], "waiting": waiting[last],
                         "kv_pct": kv[last]})


def aligned(curve: pd.DataFrame, seconds: np.ndarray, column: str) -> np.ndarray:
    """``column`` of ``curve`` at each of ``seconds``: a second without a sample carries the
    previous one; after the curve's last sample (and before its first) the value is 0."""
    t = curve["t"].to_numpy(int)
    values = curve[column].to_numpy(float)
    idx = np.searchsorted(t, seconds, "right") - 1
    out = np.where(idx >= 0, values[np.clip(idx, 0, None)], 0.0) if len(t) else np.zeros(len(seconds))
    if len(t):
        out = np.where(seconds > t[-1], 0.0, out)
    return out


def curve_mae(measured: pd.DataFrame, simulated: pd.DataFrame, column: str) -> float:
    """Mean absolute difference of two per-second curves over every second of either run."""
    last = int(max(measured["t"].max() if len(measured) else 0, simulated["t"].max() if len(simulated) else 0))
    if last < 1:
        return math.nan
    seconds = np.arange(1, last + 1)
    return float(np.abs(aligned(measured, seconds, column) - aligned(simulated, seconds, column)).mean())


def curve_stats(curve: pd.DataFrame) -> dict[str, float]:
    """Peak and mean KV usage (%) over the sampled seconds (the rows a curve has)."""
    kv = curve["kv_pct"].to_numpy(float)
    return {"kv_peak_pct": float(kv.max()) if len(kv) else math.nan,
            "kv_mean_pct": float(kv.mean()) if len(kv) else math.nan}


# --- one replay and the whole validation ----------------------------------------------------------


@dataclass
class Replay:
    """One simulated replay: its config, numbers and per-second curves."""

    policy: str
    cost_model: str
    config: ExperimentConfig
    stats: dict[str, float]
    latencies: Latencies
    curves: pd.DataFrame
    kv_mae_pp: float
    running_mae: float
    waiting_mae: float
    summary: dict
    wall_s: float

    @property
    def label(self) -> str:
        return f"{self.policy} {self.cost_model}"


def run_replay(folder: RunFolder, plan: ReplayPlan, policy: str, cost_model: str,
               measured: pd.DataFrame, overrides: list[str] | tuple[str, ...] = ()) -> Replay:
    """Simulate the run under ``policy`` with ``cost_model`` and measure it as the engine was."""
    from kvsim.simulator.engine.runner import run_experiment

    cfg = replay_config(folder, plan, policy, cost_model, overrides)
    t0 = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # profile extrapolation: counted in the summary, reported below
        result = run_experiment(cfg)
    wall = time.perf_counter() - t0
    requests = result.requests
    _check_same_requests(folder, requests)
    _check_all_served(folder, requests)
    lat = simulated_latencies(requests)
    curves = simulated_curves(result.steps, requests, result.summary["kv_capacity_slots"])
    stats = {**latency_stats(lat), **curve_stats(curves),
             "preemptions": float(result.summary.get("num_preemptions", 0) or 0)}
    return Replay(policy, cost_model, cfg, stats, lat, curves, curve_mae(measured, curves, "kv_pct"),
                  curve_mae(measured, curves, "running"), curve_mae(measured, curves, "waiting"),
                  result.summary, wall)


def _check_same_requests(folder: RunFolder, simulated: pd.DataFrame) -> None:
    """The workload must be the run's: same number of requests, same lengths in arrival order."""
    meas = folder.requests
    sim = simulated.sort_values("request_id", kind="stable")
    if len(sim) != len(meas):
        raise ValidateError(f"{folder.workload}: {len(sim)} requests, but {folder.files['requests']} records "
                            f"{len(meas)}: not this run's workload")
    a = meas[["input_toks", "output_toks"]].to_numpy(int)
    b = sim[["prompt_tokens", "output_tokens"]].to_numpy(int)
    bad = np.flatnonzero((a != b).any(axis=1))
    if len(bad):
        i = int(bad[0])
        raise ValidateError(f"{folder.files['requests']}:{int(meas['line'].iloc[i])}: input_toks/output_toks "
                            f"{_ints(a[i])} differ from the workload's request {i} {_ints(b[i])} (in arrival order): "
                            "not this run's workload")


def _ints(values) -> tuple[int, ...]:
    """Numbers as a message prints them: ``(576, 12)``, never ``(np.int64(576), ...)``."""
    return tuple(int(x) for x in values)


def _check_all_served(folder: RunFolder, simulated: pd.DataFrame) -> None:
    """The engine served every request of the run (each has a last token): a replay that
    rejects or aborts one is not replaying this run (its context window or KV capacity is
    not the engine's), and its latencies would be over other requests."""
    ended = simulated[simulated["status"] != "finished"].sort_values("request_id", kind="stable")
    if not len(ended):
        return
    first = ended.iloc[0]
    kinds = ", ".join(f"{int(n)} {k}" for k, n in ended["status"].value_counts().sort_index().items())
    raise ValidateError(f"the replay did not serve {len(ended)} of the {len(simulated)} requests the engine served "
                        f"(all of them, {folder.files['requests']}): {kinds}, e.g. request "
                        f"{int(first['request_id'])}: {first['reason']}; "
                        "the replay's settings are not the run's: give the run's context window with "
                        "--max-model-len N or its KV capacity with --num-gpu-blocks N (and check --set overrides)")


@dataclass
class Validation:
    """Everything the report shows."""

    folder: RunFolder
    plan: ReplayPlan
    measured: dict[str, float]
    measured_latencies: Latencies
    measured_curves: pd.DataFrame
    replays: list[Replay]  # the chosen cost model for each policy, then the roofline references
    preemptions_recorded: bool
    notes: list[str]
    wall_s: float
    #: requests the engine scheduled within UNQUEUED_S of queueing them (arrival order): their
    #: TTFT is prefill time under the running batch, not queueing
    unqueued: np.ndarray = field(default_factory=lambda: np.zeros(0, bool))
    #: measured metrics the run did not record (reported as such, never as a missed target)
    not_recorded: dict[str, str] = field(default_factory=dict)  # metric key -> why
    #: (policy, cost model, error) of each replay that could not run; the others are reported
    failures: list[tuple[str, str, str]] = field(default_factory=list)

    def main_replays(self) -> list[Replay]:
        return [r for r in self.replays if r.cost_model == self.plan.cost_model]

    def reference_replays(self) -> list[Replay]:
        return [r for r in self.replays if r.cost_model != self.plan.cost_model]


NOT_RECORDED_COLUMNS = {"running": ("running",), "kv_cache_pct": ("kv_peak_pct", "kv_mean_pct", "kv_usage_mae_pp")}
"""timeseries.csv columns that cannot be 0 in every row of a run that served requests (a request
runs and holds KV), so a column of zeros means "not recorded", and the metrics read from it."""


def not_recorded(timeseries: pd.DataFrame) -> dict[str, str]:
    """Measured metric -> why it was not recorded: ``preemptions`` without a ``preempted``
    column, and the metrics of a :data:`NOT_RECORDED_COLUMNS` column that is 0 in every row."""
    out = {}
    if "preempted" not in timeseries.columns:
        out["preemptions"] = "this run's timeseries.csv has no 'preempted' column"
    for column, metrics in NOT_RECORDED_COLUMNS.items():
        if not timeseries[column].to_numpy(float).any():
            for m in metrics:
                out[m] = f"this run's timeseries.csv has {column} 0 in every row"
    return out


TIE_S = 0.5
"""Requests queued within this many seconds of each other may have been queued in another order
than they were sent (data parallel: each engine stamps its own ``queued_ts``)."""


def match_workload(folder: RunFolder, lengths: np.ndarray) -> RunFolder:
    """``folder`` with its requests in the workload's order (``lengths``: (prompt, output) per
    workload request, in arrival order). When the measured order (``request_order``) does not
    give the workload's lengths, requests queued within :data:`TIE_S` of the earliest one not
    yet matched are taken in the order that does; failing that the folder is returned as read
    and the replay's check names the first difference."""
    meas = folder.requests
    have = meas[["input_toks", "output_toks"]].to_numpy(int)
    if len(have) != len(lengths) or (have == lengths).all():
        return folder
    order = np.argsort(meas["queued_ts"].to_numpy(float), kind="stable")
    queued = meas["queued_ts"].to_numpy(float)[order]
    used = np.zeros(len(order), bool)
    picked, head = [], 0
    for want in lengths:
        while used[head]:
            head += 1
        j = head
        while j < len(order) and queued[j] - queued[head] <= TIE_S:
            if not used[j] and (have[order[j]] == want).all():
                break
            j += 1
        else:
            return folder
        if j >= len(order) or queued[j] - queued[head] > TIE_S:
            return folder
        used[j] = True
        picked.append(order[j])
    return replace(folder, requests=meas.iloc[picked].reset_index(drop=True))


REPLAY_ERRORS = (ValidateError, ValueError, RuntimeError)
"""What a replay that cannot run raises (config and profile errors are ValueErrors, a stalled
simulation a RuntimeError): recorded for the report, so the other replays still are."""


def validate_run(path: str | Path, *, workload: str | Path | None = None, cost_model: str = "profiled",
                 profile: str | None = None, gpu: str | None = None, model: str | None = None,
                 overrides: list[str] | tuple[str, ...] = (), policies: tuple[str, ...] | None = None,
                 given: dict[str, Any] | None = None) -> Validation:
    """Replay a measured run under each available policy (and the roofline for reference).
    ``given``: engine settings from the command line (``EngineSettings`` field -> value).
    A replay that fails is reported as failed; only when every replay with ``cost_model``
    fails is it an error."""
    from kvsim.traces import read_lengths

    t0 = time.perf_counter()
    folder = read_run_folder(path, workload)
    plan = plan_replay(folder, cost_model=cost_model, profile=profile, gpu=gpu, model=model, given=given)
    folder = match_workload(folder, np.array(list(read_lengths(folder.workload, "token-ids")), dtype=int)
                            .reshape(-1, 2))
    notes = list(plan.notes)
    policies = policies or tuple(p for p in POLICIES if policy_available(p))
    if "vllm-v1" not in policies:
        notes.append("scheduler.policy vllm-v1 is not in this kvsim yet: only the vllm-v0 replay is shown.")
    missing = not_recorded(folder.timeseries)
    meas_lat = measured_latencies(folder.requests)
    meas_curves = measured_curves(folder.timeseries)
    measured = {**latency_stats(meas_lat), **curve_stats(meas_curves)}
    recorded = "preemptions" not in missing
    measured["preemptions"] = float(folder.timeseries["preempted"].sum()) if recorded else math.nan
    for key in missing.keys() & measured.keys():
        measured[key] = math.nan
    kinds = [cost_model] + (["roofline"] if cost_model != "roofline" else [])  # the roofline for reference
    replays, failures = [], []
    for k in kinds:
        for p in policies:
            try:
                replays.append(run_replay(folder, plan, p, k, meas_curves, overrides))
            except REPLAY_ERRORS as e:
                failures.append((p, k, " ".join(str(e).split())))
    if not any(r.cost_model == cost_model for r in replays):
        by_error: dict[str, list[str]] = {}
        for p, k, e in failures:
            by_error.setdefault(e, []).append(f"{p} ({k})")
        raise ValidateError("every replay failed: " + "; ".join(f"{' and '.join(who)}: {e}"
                                                               for e, who in by_error.items()))
    for r in replays:  # a curve the run did not record has no error to report
        if "running" in missing:
            r.running_mae = math.nan
        if "kv_usage_mae_pp" in missing:
            r.kv_mae_pp = math.nan
    s = plan.settings
    ran = {r.policy for r in replays}
    partial = "not recorded" if s.max_num_partial_prefills is None else f"recorded {s.max_num_partial_prefills}"
    if "vllm-v1" in ran:
        notes.append(f"vllm-v1 replay: token budget {s.max_num_batched_tokens}, long_prefill_token_threshold "
                     f"{s.long_prefill_token_threshold}, scheduler_reserve_full_isl {str(s.reserve_full_isl).lower()}; "
                     f"max_num_partial_prefills ({partial}) is not applied: vLLM 0.19's "
                     "v1 scheduler carries the setting but does not read it.")
    if "vllm-v0" in ran:
        v0 = next(r for r in replays if r.policy == "vllm-v0")
        notes.append(f"vllm-v0 replay: no chunked prefill, so its token budget is "
                     f"{v0.config.max_num_batched_tokens} (a whole prompt, as vLLM v0 requires), and prefill-only "
                     f"admission steps; watermark {v0.config.allocator.watermark:g}.")
    notes.append("Not modelled: async scheduling and CUDA graphs (their effect is at most one step per event).")
    outside = {r.label: r.summary.get("cost_out_of_grid_lookups", 0) for r in replays if r.cost_model == "profiled"}
    if any(outside.values()):
        notes.append("Step times looked up outside the profile's measured grid (clamped below, extrapolated "
                     "above): " + ", ".join(f"{k} {v:,}" for k, v in outside.items()) + ".")
    if not recorded:
        notes.append("Measured preemptions: not recorded (this run's timeseries.csv has no 'preempted' column).")
    for column, metrics in NOT_RECORDED_COLUMNS.items():
        if metrics[0] in missing:
            notes.append(f"Measured {column}: not recorded ({missing[metrics[0]]}): "
                         f"{', '.join(metrics)} are not compared.")
    for p, k, e in failures:
        notes.append(f"The {p} replay ({k}) failed: {e}")
    wait = (folder.requests["scheduled_ts"] - folder.requests["queued_ts"]).to_numpy(float)
    unqueued = np.isfinite(wait) & (wait < UNQUEUED_S)
    return Validation(folder, plan, measured, meas_lat, meas_curves, replays, recorded, notes,
                      time.perf_counter() - t0, unqueued, missing, failures)


def pct_diff(simulated: float, measured: float) -> float:
    """(simulated - measured) / measured, in %; NaN when either is missing or measured is 0."""
    if not (math.isfinite(simulated) and math.isfinite(measured)) or measured == 0:
        return math.nan
    return 100.0 * (simulated - measured) / measured
