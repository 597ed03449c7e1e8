"""Experiment configuration: one YAML file, validated on load, overridable per key.

Errors name the file, the line, the key path and what is allowed, e.g.::

    configs/x.yaml:14: allocator.block_size: must be a power of two from 1 to 256 (got 3)
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from simulator.capacity import kv_cache_bytes, kv_slots
from simulator.cost_model.catalogue import GPUS, MODELS, GiB, GPUSpec, ModelSpec
from simulator.workload import WorkloadConfig


class ConfigError(ValueError):
    """A configuration problem, already formatted as one line for the user."""


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ModelConfig(Strict):
    """A model from the catalogue (``simulator.cost_model.catalogue.MODELS``)."""

    name: str = "llama-2-7b"
    max_seq_len: int | None = Field(None, gt=0, description="tokens; default: the model's context window")

    @field_validator("name")
    @classmethod
    def _known(cls, v: str) -> str:
        if v.lower() not in MODELS:
            raise ValueError(f"unknown model {v!r}; choose one of {', '.join(MODELS)}")
        return v.lower()

    @property
    def spec(self) -> ModelSpec:
        return MODELS[self.name]

    @property
    def context_len(self) -> int:
        return self.max_seq_len or self.spec.max_seq_len


class HardwareConfig(Strict):
    """GPUs of one replica (``tensor_parallel`` of them) and how many replicas."""

    gpu: str = "a100-80gb"
    tensor_parallel: int = Field(1, ge=1, le=64)
    num_replicas: int = Field(1, ge=1, le=1024)
    gpu_memory_utilization: float = Field(0.9, gt=0, le=1)
    kv_cache_gb: float | None = Field(None, gt=0, description="GiB of KV per replica; overrides the computed value")
    activation_reserve_gb: float = Field(1.0, ge=0, description="GiB per GPU kept for activations")
    swap_space_gb: float = Field(4.0, ge=0, description="GiB of CPU swap space per GPU")
    pcie: Literal["gen4", "gen5"] | None = None

    @field_validator("gpu")
    @classmethod
    def _known(cls, v: str) -> str:
        if v.lower() not in GPUS:
            raise ValueError(f"unknown GPU {v!r}; choose one of {', '.join(GPUS)}")
        return v.lower()

    @property
    def spec(self) -> GPUSpec:
        return GPUS[self.gpu]


PRESETS = ("orca-max", "orca-pow2", "orca-oracle", "fastertransformer")


class AllocatorConfig(Strict):
    """``paged`` (vLLM) or ``contiguous`` (Orca / FasterTransformer baselines)."""

    kind: Literal["paged", "contiguous"] = "paged"
    preset: Literal["orca-max", "orca-pow2", "orca-oracle", "fastertransformer"] | None = None
    block_size: int = 16
    placement: Literal["buddy", "first_fit", "best_fit"] = "buddy"
    reservation: Literal["max", "pow2", "oracle"] = "max"
    max_seq_len: int | None = Field(None, gt=0, description="reservation of 'max' (tokens); default: the model's")
    watermark: float = Field(0.01, ge=0, lt=0.5, description="share of KV slots kept free at admission")
    prefix_caching: bool = False

    @field_validator("block_size")
    @classmethod
    def _pow2(cls, v: int) -> int:
        if not (1 <= v <= 256 and v & (v - 1) == 0):
            raise ValueError(f"must be a power of two from 1 to 256 (got {v})")
        return v

    @model_validator(mode="after")
    def _preset_is_contiguous(self) -> AllocatorConfig:
        if self.preset is not None and self.kind != "contiguous":
            raise ValueError(f"preset {self.preset!r} is a contiguous allocator: set kind: contiguous")
        return self


class SchedulerConfig(Strict):
    """vLLM v0 scheduling limits; ``batching: request`` is FasterTransformer's request-level batching."""

    max_num_seqs: int = Field(256, ge=1)
    max_num_batched_tokens: int | None = Field(None, ge=1, description="default: max(2048, max_seq_len)")
    batching: Literal["iteration", "request"] = "iteration"
    router: Literal["round_robin", "least_outstanding_tokens"] = "round_robin"
    macro_steps: bool = True  # advance runs of identical decode steps at once (same results, faster)


class PreemptionConfig(Strict):
    """``auto`` is vLLM's default: recompute single-sequence groups, swap multi-sequence ones."""

    mode: Literal["recompute", "swap", "auto"] = "auto"
    swap_fallback: Literal["recompute", "abort"] = "recompute"
    overlap_swap: bool = False  # swaps use the PCIe link while the GPU computes (max instead of sum)


class DecodingConfig(Strict):
    """How parallel samples and beams behave (see ``simulator.decoding``)."""

    sample_lengths: Literal["same", "independent"] = "same"
    beam_concentration: float = Field(1.0, ge=0, description="0 = parents chosen uniformly")


class CostModelConfig(Strict):
    """``roofline`` needs no GPU; ``calibrated`` reads a profile from ``kvsim calibrate``."""

    kind: Literal["roofline", "calibrated"] = "roofline"
    profile: str | None = None
    compute_efficiency: float = Field(0.6, gt=0, le=1)
    memory_efficiency: float = Field(0.8, gt=0, le=1)
    step_overhead_s: float = Field(1e-3, ge=0)
    swap_batched: bool = False

    @model_validator(mode="after")
    def _profile_given(self) -> CostModelConfig:
        if self.kind == "calibrated" and not self.profile:
            raise ValueError("kind 'calibrated' needs profile: PATH (a YAML written by kvsim calibrate)")
        return self


class MetricsConfig(Strict):
    """SLOs for goodput, and the window memory classes are averaged over.

    ``window``: ``busy`` (all engine steps), ``saturated`` (for each replica, from its
    first to its last step with a request waiting: steady state under load), or set ``window_start_s`` /
    ``window_end_s`` (seconds of simulated time) for an explicit interval.
    """

    slo_ttft_ms: float | None = Field(None, gt=0)
    slo_tpot_ms: float | None = Field(None, gt=0)
    window: Literal["busy", "saturated"] = "busy"
    window_start_s: float | None = Field(None, ge=0)
    window_end_s: float | None = Field(None, gt=0)
    step_table: bool = True  # write the per-step table (Parquet)

    @property
    def measurement_window(self) -> str | tuple[float | None, float | None]:
        if self.window_start_s is not None or self.window_end_s is not None:
            return (self.window_start_s, self.window_end_s)
        return self.window


class ExperimentConfig(Strict):
    name: str = "experiment"
    seed: int = 0
    model: ModelConfig = ModelConfig()
    hardware: HardwareConfig = HardwareConfig()
    workload: WorkloadConfig
    allocator: AllocatorConfig = AllocatorConfig()
    scheduler: SchedulerConfig = SchedulerConfig()
    preemption: PreemptionConfig = PreemptionConfig()
    decoding: DecodingConfig = DecodingConfig()
    cost_model: CostModelConfig = CostModelConfig()
    metrics: MetricsConfig = MetricsConfig()
    output_dir: str = "results"

    @model_validator(mode="after")
    def _fits(self) -> ExperimentConfig:
        if self.kv_bytes <= 0:
            need = self.model.spec.weight_bytes / self.hardware.tensor_parallel / GiB
            raise ValueError(
                f"model {self.model.name} ({need:.1f} GiB of weights per GPU at tensor_parallel "
                f"{self.hardware.tensor_parallel}) leaves no KV memory on {self.hardware.gpu}: "
                "raise hardware.tensor_parallel or hardware.gpu_memory_utilization, or set hardware.kv_cache_gb"
            )
        if self.kv_slots < self.allocator.block_size:
            raise ValueError(f"KV cache of {self.kv_slots} slots holds less than one block")
        trace = self.workload.trace
        if self.allocator.prefix_caching and trace is not None and trace.hash_block_tokens % self.allocator.block_size:
            raise ValueError(
                f"allocator.block_size {self.allocator.block_size} must divide the trace's hash block of "
                f"{trace.hash_block_tokens} tokens (workload.trace.hash_block_tokens) for prefix caching"
            )
        if self.max_num_batched_tokens < self.model.context_len:
            raise ValueError(
                f"scheduler.max_num_batched_tokens ({self.max_num_batched_tokens}) must be >= the model's "
                f"max_seq_len ({self.model.context_len}), or long prompts could never be scheduled"
            )
        return self

    @property
    def kv_bytes(self) -> float:
        hw = self.hardware
        if hw.kv_cache_gb is not None:
            return hw.kv_cache_gb * GiB
        return kv_cache_bytes(self.model.spec, hw.spec, hw.tensor_parallel, hw.gpu_memory_utilization,
                              hw.activation_reserve_gb * GiB)

    @property
    def kv_slots(self) -> int:
        return kv_slots(self.kv_bytes, self.model.spec)

    @property
    def max_num_batched_tokens(self) -> int:
        return self.scheduler.max_num_batched_tokens or max(2048, self.model.context_len)


# --- loading -------------------------------------------------------------------------

def line_map(node: yaml.Node, path: tuple = (), out: dict | None = None) -> dict[tuple, int]:
    """Map each key path in a YAML document to its 1-based line."""
    out = {} if out is None else out
    if isinstance(node, yaml.MappingNode):
        for k, v in node.value:
            p = path + (k.value,)
            out[p] = k.start_mark.line + 1
            line_map(v, p, out)
    elif isinstance(node, yaml.SequenceNode):
        for i, v in enumerate(node.value):
            out[path + (i,)] = v.start_mark.line + 1
            line_map(v, path + (i,), out)
    return out


def parse_override(text: str) -> tuple[list[str], Any]:
    """``a.b.c=value`` -> (["a", "b", "c"], value parsed as YAML)."""
    if "=" not in text:
        raise ConfigError(f"--set {text}: expected KEY.PATH=VALUE, e.g. allocator.block_size=32")
    key, raw = text.split("=", 1)
    if not key.strip():
        raise ConfigError(f"--set {text}: empty key")
    try:
        value = yaml.safe_load(raw) if raw.strip() else None
    except yaml.YAMLError as e:
        raise ConfigError(f"--set {text}: value is not valid YAML ({e.problem})") from None
    return key.strip().split("."), value


def apply_override(raw: dict, keys: list[str], value: Any) -> None:
    node = raw
    for k in keys[:-1]:
        nxt = node.get(k)
        if nxt is None:
            nxt = node[k] = {}
        if not isinstance(nxt, dict):
            raise ConfigError(f"--set {'.'.join(keys)}: {k} is not a section")
        node = nxt
    node[keys[-1]] = value


def _format_errors(err: ValidationError, source: str, lines: dict[tuple, int], overridden: set[tuple]) -> str:
    msgs = []
    for e in err.errors():
        loc = tuple(x for x in e["loc"] if not (isinstance(x, str) and x.startswith("function-")))
        key = ".".join(str(x) for x in loc)  # empty: a check across sections names its keys itself
        msg = e["msg"].removeprefix("Value error, ")
        if e["type"] == "extra_forbidden":
            msg = "unknown key"
            parent = loc[:-1]
            model = ExperimentConfig
            allowed = _allowed_keys(model, parent)
            if allowed:
                msg += f"; allowed here: {', '.join(allowed)}"
        elif e["type"] == "missing":
            msg = "required key is missing"
        elif "input" in e and e["type"] not in ("model_type",) and not isinstance(e["input"], dict):
            msg += f" (got {e['input']!r})"
        where = source
        for n in range(len(loc), 0, -1):
            if loc[:n] in overridden:
                where = "--set"
                break
            if loc[:n] in lines:
                where = f"{source}:{lines[loc[:n]]}"
                break
        msgs.append(f"{where}: {key}: {msg}" if key else f"{where}: {msg}")
    return "\n".join(msgs)


def _allowed_keys(model: type[BaseModel], path: tuple) -> list[str]:
    for k in path:
        field = model.model_fields.get(str(k)) if isinstance(model, type) else None
        ann = getattr(field, "annotation", None)
        if not (isinstance(ann, type) and issubclass(ann, BaseModel)):
            return []
        model = ann
    return list(model.model_fields)


def read_yaml(path: str | Path, what: str = "config", error: type[Exception] = ConfigError) -> tuple[Any, dict]:
    """Parse a YAML file; return its data and a map from key paths to 1-based lines.

    Unreadable files and YAML syntax errors raise ``error`` with the file and line.
    """
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as e:
        raise error(f"{path}: cannot read {what} ({e.strerror})") from None
    try:
        node = yaml.compose(text)
        raw = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark else str(path)
        raise error(f"{where}: not valid YAML ({getattr(e, 'problem', None) or e})") from None
    return raw, (line_map(node) if node else {})


def load_config(path: str | Path, overrides: list[str] | tuple[str, ...] = ()) -> tuple[ExperimentConfig, Path]:
    """Read, override and validate a YAML experiment; return it and its folder."""
    path = Path(path)
    raw, lines = read_yaml(path)
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: the top level must be a mapping of sections (model, hardware, workload, ...)")
    return validate_config(raw, source=str(path), lines=lines, overrides=overrides), path.parent


def validate_config(raw: dict, source: str = "<config>", lines: dict | None = None,
                    overrides: list[str] | tuple[str, ...] = ()) -> ExperimentConfig:
    """Validate a config dict (after applying ``--set`` overrides)."""
    overridden: set[tuple] = set()
    for text in overrides:
        keys, value = parse_override(text)
        apply_override(raw, keys, value)
        overridden.add(tuple(keys))
    try:
        return ExperimentConfig.model_validate(raw)
    except ValidationError as e:
        raise ConfigError(_format_errors(e, source, lines or {}, overridden)) from None
