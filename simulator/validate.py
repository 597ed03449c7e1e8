"""``kvsim validate``: replay a measured serving run and compare the simulation with it.

A run folder (:mod:`simulator.measured_run`: meta.json, requests.jsonl, timeseries.csv and the
workload with token ids) holds what a real engine did. The replay uses the engine settings the
run records, its measured KV block count and a chosen cost model; nothing is fitted to the
measured latencies. It runs under ``vllm-v1`` (when kvsim has it) and ``vllm-v0``, side by side,
plus the roofline for reference; :mod:`simulator.validate_report` writes the report.

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
"""

from __future__ import annotations

import math
import re
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from kvsim.simulator.config import (
    SCHEDULER_POLICIES,
    ConfigError,
    ExperimentConfig,
    validate_config,
)
from kvsim.simulator.cost_model.catalogue import GPUS, MODELS
from kvsim.simulator.measured_run import (
    EngineSettings,
    RunFolder,
    ValidateError,
    engine_settings,
    gpu_key,
    model_key,
    read_run_folder,
)
from kvsim.simulator.memory_classes import CLASSES

UNQUEUED_S = 0.05
"""A request scheduled within this many seconds of being queued did not wait in the queue."""

POLICIES = ("vllm-v1", "vllm-v0")
"""Scheduling policies a validation replays, in report order."""

COST_MODELS = ("profiled", "roofline")

PERCENTILES = (50, 90, 99)

LATENCIES = (("ttft", "TTFT", "s", 1.0), ("tpot", "TPOT", "ms", 1e3), ("e2e", "E2E", "s", 1.0))
"""(key, label, unit, factor from seconds) of each latency the report compares."""

FREE_CLASSES = CLASSES[3:]  # external_frag, stranded_free, idle_free: slots in no block held


def policy_available(policy: str) -> bool:
    """Whether this kvsim's config accepts ``scheduler.policy: <policy>`` (``vllm-v0`` is the
    paper's scheduler, always there; ``vllm-v1`` arrives with its own issue)."""
    return policy in SCHEDULER_POLICIES


def default_profile(gpu: str, model: str) -> str | None:
    """The shipped operator profile measured on this GPU for this model (``<gpu>-<model>``)."""
    from kvsim.simulator.cost_model.operator_profile import PROFILES_DIR

    name = f"{gpu}-{model}"
    return name if (PROFILES_DIR / f"{name}.yaml").is_file() else None


DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "half": 2, "auto": 2, "float32": 4, "float": 4}


@dataclass
class ReplayPlan:
    """How a run is replayed: the settings, the resolved names, and what the report must say."""

    settings: EngineSettings
    model: dict  # the config's model section
    gpu: str
    num_gpu_blocks: int | None  # passed to hardware.num_gpu_blocks (None: computed capacity)
    cost_model: str
    profile: str | None
    notes: list[str] = field(default_factory=list)


def plan_replay(folder: RunFolder, *, cost_model: str = "profiled", profile: str | None = None,
                gpu: str | None = None, model: str | None = None) -> ReplayPlan:
    """Resolve the model, GPU, profile and KV capacity of a replay from the run's meta.json."""
    where = str(folder.files["meta"])
    s = engine_settings(folder.meta, where)
    notes: list[str] = []
    if gpu is None:
        gpu = gpu_key(s.gpu_name)
        if gpu is None:
            raise ValidateError(f"{where}: hardware.device_name {s.gpu_name!r} is no GPU in kvsim's catalogue; "
                                f"give --gpu NAME (one of {', '.join(GPUS)})")
    elif gpu.lower() not in GPUS:
        raise ValidateError(f"--gpu {gpu}: unknown GPU; choose one of {', '.join(GPUS)}")
    gpu = gpu.lower()
    dtype = s.dtype.removeprefix("torch.").lower()
    key = model.lower() if model else model_key(s.model)
    if model and key not in MODELS:
        raise ValidateError(f"--model {model}: unknown model; choose one of {', '.join(MODELS)}")
    max_len = s.max_model_len
    if key is not None:
        model_section: dict = {"name": key}
        if MODELS[key].dtype_bytes != DTYPE_BYTES.get(dtype, 2):
            notes.append(f"The run's dtype {dtype} differs from the catalogue's {MODELS[key].dtype_bytes}-byte "
                         "weights; the catalogue's are used.")
    elif s.model_shape is not None:
        model_section = {"name": re.sub(r"[^A-Za-z0-9._-]", "-", s.model.split("/")[-1]),
                         "shape": {**s.model_shape, "dtype_bytes": DTYPE_BYTES.get(dtype, 2)}}
        notes.append(f"{s.model} is not in kvsim's catalogue: its shape is read from the run's resolved "
                     "config (model_config.hf_config).")
    else:
        raise ValidateError(f"{where}: model {s.model!r} is not in kvsim's catalogue and the run's resolved config "
                            f"records no shape (model_config.hf_config); give --model NAME (one of {', '.join(MODELS)})")
    if max_len is not None:
        model_section["context_len_tokens"] = max_len
    if cost_model not in COST_MODELS:
        raise ValidateError(f"--cost-model {cost_model}: choose one of {', '.join(COST_MODELS)}")
    if cost_model == "profiled" and profile is None:
        profile = default_profile(gpu, key or model_section["name"].lower())
        if profile is None:
            raise ValidateError(f"no shipped operator profile for {gpu} + {key or s.model}: give --profile NAME or "
                                "PATH (kvsim calibrate --import writes one), or --cost-model roofline")
    if cost_model == "roofline":
        profile = None
    blocks = None
    if s.num_gpu_blocks is not None:
        if s.num_gpu_blocks < 2:
            raise ValidateError(f"{where}: kv_cache.num_gpu_blocks {s.num_gpu_blocks}: fewer than 2 blocks")
        blocks = s.num_gpu_blocks - 1
        notes.append(f"KV capacity: the run's {s.num_gpu_blocks:,} blocks minus 1, {blocks:,} blocks of "
                     f"{s.block_size} tokens: vLLM's block pool keeps one block as the null block, never "
                     "given to a request.")
    else:
        notes.append("KV capacity: meta.json does not record num_gpu_blocks, so it is computed as vLLM does "
                     f"(GPU memory x gpu_memory_utilization {s.gpu_memory_utilization:g} - weights - activation "
                     "reserve, simulator/capacity.py); the report's capacity is that computed value.")
    return ReplayPlan(s, model_section, gpu, blocks, cost_model, profile, notes)


def replay_config(folder: RunFolder, plan: ReplayPlan, policy: str, cost_model: str | None = None,
                  overrides: list[str] | tuple[str, ...] = ()) -> ExperimentConfig:
    """The kvsim experiment that replays ``folder`` under ``policy`` (vllm-v1 or vllm-v0)."""
    s = plan.settings
    kind = cost_model or plan.cost_model
    hardware: dict = {"gpu": plan.gpu, "tensor_parallel": s.tensor_parallel, "swap_space_gib": 0}
    if plan.num_gpu_blocks is not None:
        hardware["num_gpu_blocks"] = plan.num_gpu_blocks
    else:
        hardware["gpu_memory_utilization"] = s.gpu_memory_utilization
    scheduler: dict = {"max_num_seqs": s.max_num_seqs}
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
    a request that did not finish has NaN latencies."""
    r = requests.sort_values("request_id", kind="stable")
    arrival, first, finish = (r[c].to_numpy(float) for c in ("arrival_s", "first_token_s", "finish_s"))
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
    """
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
    from kvsim.simulator.runner import run_experiment

    cfg = replay_config(folder, plan, policy, cost_model, overrides)
    t0 = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # profile extrapolation: counted in the summary, reported below
        result = run_experiment(cfg)
    wall = time.perf_counter() - t0
    requests = result.requests
    _check_same_requests(folder, requests)
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
        i = bad[0]
        raise ValidateError(f"{folder.files['requests']}:{int(meas['line'].iloc[i])}: input_toks/output_toks "
                            f"{tuple(a[i])} differ from the workload's request {i} {tuple(b[i])} (in arrival order): "
                            "not this run's workload")


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

    def main_replays(self) -> list[Replay]:
        return [r for r in self.replays if r.cost_model == self.plan.cost_model]

    def reference_replays(self) -> list[Replay]:
        return [r for r in self.replays if r.cost_model != self.plan.cost_model]


def validate_run(path: str | Path, *, workload: str | Path | None = None, cost_model: str = "profiled",
                 profile: str | None = None, gpu: str | None = None, model: str | None = None,
                 overrides: list[str] | tuple[str, ...] = (), policies: tuple[str, ...] | None = None) -> Validation:
    """Replay a measured run under each available policy (and the roofline for reference)."""
    t0 = time.perf_counter()
    folder = read_run_folder(path, workload)
    plan = plan_replay(folder, cost_model=cost_model, profile=profile, gpu=gpu, model=model)
    notes = list(plan.notes)
    policies = policies or tuple(p for p in POLICIES if policy_available(p))
    if "vllm-v1" not in policies:
        notes.append("scheduler.policy vllm-v1 is not in this kvsim yet: only the vllm-v0 replay is shown.")
    meas_lat = measured_latencies(folder.requests)
    meas_curves = measured_curves(folder.timeseries)
    measured = {**latency_stats(meas_lat), **curve_stats(meas_curves)}
    recorded = "preempted" in folder.timeseries.columns
    measured["preemptions"] = float(folder.timeseries["preempted"].sum()) if recorded else math.nan
    kinds = [cost_model] + (["roofline"] if cost_model != "roofline" else [])  # the roofline for reference
    replays = [run_replay(folder, plan, p, k, meas_curves, overrides) for k in kinds for p in policies]
    s = plan.settings
    if "vllm-v1" in policies:
        notes.append(f"vllm-v1 replay: token budget {s.max_num_batched_tokens}, long_prefill_token_threshold "
                     f"{s.long_prefill_token_threshold}, scheduler_reserve_full_isl {str(s.reserve_full_isl).lower()}; "
                     f"max_num_partial_prefills (recorded {s.max_num_partial_prefills}) is not applied: vLLM 0.19's "
                     "v1 scheduler carries the setting but does not read it.")
    if "vllm-v0" in policies:
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
    wait = (folder.requests["scheduled_ts"] - folder.requests["queued_ts"]).to_numpy(float)
    unqueued = np.isfinite(wait) & (wait < UNQUEUED_S)
    return Validation(folder, plan, measured, meas_lat, meas_curves, replays, recorded, notes,
                      time.perf_counter() - t0, unqueued)


def pct_diff(simulated: float, measured: float) -> float:
    """(simulated - measured) / measured, in %; NaN when either is missing or measured is 0."""
    if not (math.isfinite(simulated) and math.isfinite(measured)) or measured == 0:
        return math.nan
    return 100.0 * (simulated - measured) / measured
