"""The ``workload:`` section of an experiment config, and the requests it describes.

A workload is either a **trace file** or a **generator**, plus optional transforms
and sharing settings applied to every request::

    workload:                                  # replay one hour of Azure chat, 10 minutes of it
      trace: {format: azure, path: traces/data/AzureLLMInferenceTrace_conv.csv}
      window: {duration_s: 600}

    workload:                                  # the vLLM paper's ShareGPT workload at 2 req/s
      arrivals: {kind: poisson, rate: 2.0}
      lengths: {kind: preset, name: sharegpt-paper}
      num_requests: 1000

Order of operations in :func:`build_requests`: read or generate -> ShareGPT filter
-> rate scale -> time window -> count window -> sharing (``n``, ``beam_width``,
``shared_prefix``) -> clip (``too_long: clip``). Requests are numbered 0, 1, 2, ...
in arrival order and arrive in seconds from the start of the (windowed) workload.

Relative paths are looked up in the current folder, then the config file's
folder (``base_dir``), then the kvsim source root, then the shipped ``traces/data``
(the path as given under each: a missing file is an error, never another file of
the same name).
"""

from __future__ import annotations

import math
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from kvsim import traces
from kvsim.traces import Request, TraceError
from kvsim.traces.arrivals import ArrivalProcess, ConstantArrivals, GammaArrivals, PoissonArrivals
from kvsim.traces.fields import MAX_SPAN_S, MAX_TOKEN_ID, SPAN_TEXT
from kvsim.traces.formats import TraceFormat, file_type_of, generic_format
from kvsim.traces.generate import generate_requests
from kvsim.traces.lengths import (
    FilteredLengths,
    FixedLengths,
    LengthSampler,
    LognormalLengths,
    PoolLengths,
    UniformLengths,
)
from kvsim.traces.loaders import load_length_pool, load_trace
from kvsim.traces.multi_turn import LLAMA3_VOCAB, MultiTurnSpec, generate_multi_turn
from kvsim.traces.presets import preset_lengths
from kvsim.traces.sharegpt_filter import sharegpt_filter, sharegpt_keep_array
from kvsim.traces.transforms import (
    apply_sharing,
    clip_to_max_len,
    scale_rate,
    window_by_count,
    window_by_time,
)

MAX_MESSAGE_TOKENS = 16 * 2**20
"""Most tokens a generator may give one prompt, answer or shared prefix (16 Mi tokens, as
``model.context_len_tokens``): beyond any published model's context window."""

MAX_RATE = 1e6
"""Highest arrival rate, requests (or conversations) per second; also the most ``rate_scale``
may speed a workload up. A million requests a second is beyond any cluster kvsim models."""

MAX_THINK_S = 86_400.0
"""Longest mean pause between a conversation's turns (a day)."""

MAX_TPOT_S = 10.0
"""Longest assumed time per output token (real engines take milliseconds; 10 s is a stall)."""

MAX_PROMPT_TOKENS = 10**10
"""Most prompt tokens a multi-turn workload may be expected to send in all (each is a token id
drawn and carried by its request: ~10^10 would take hours and tens of GB); the largest
multi-turn benchmark sends ~1.5 x 10^8."""

PositiveFloat = Annotated[float, Field(gt=0, allow_inf_nan=False)]
NonNegativeFloat = Annotated[float, Field(ge=0, allow_inf_nan=False)]
PositiveInt = Annotated[int, Field(ge=1)]
Rate = Annotated[float, Field(gt=0, le=MAX_RATE, allow_inf_nan=False)]
Seconds = Annotated[float, Field(ge=0, le=MAX_SPAN_S, allow_inf_nan=False)]
TokenCount = Annotated[int, Field(ge=1, le=MAX_MESSAGE_TOKENS)]
TokenMean = Annotated[float, Field(ge=1, le=MAX_MESSAGE_TOKENS, allow_inf_nan=False)]


MAX_REQUESTS = 100_000_000
"""Most requests one run may generate. Every request keeps a row of the per-request table:
measured, 0.6 KB of peak memory per request (200,000 vs 20,000 requests, step table off), so
10^8 requests already need ~60 GB, at ~20,000 requests per wall second about 1.5 hours; the
largest public traces hold a few million requests. More cannot be meant."""


MAX_GROUP = 1024
"""Most parallel samples or beams per request (a group is scheduled as one: it must fit in one
batch; vLLM's defaults allow 256 sequences a batch)."""


def _numeric(annotation: Any) -> bool:
    """True if a field's type takes numbers and not booleans (``int | None`` yes, ``bool`` no)."""
    if annotation is bool:
        return False
    if annotation in (int, float):
        return True
    args = typing.get_args(annotation)
    return any(_numeric(a) for a in args) and not any(a is bool for a in args)


def _integral(annotation: Any) -> bool:
    """True if a field's type takes integers and no other numbers or text (``int | None`` yes)."""
    args = typing.get_args(annotation) or (annotation,)
    return int in args and not any(a in (float, str, bool) for a in args)


def numbers_are_not_booleans(cls: type[BaseModel], data: Any) -> Any:
    """A ``before`` model validator: YAML's ``true`` is not the number 1, nor ``'16'`` the
    integer 16 (pydantic would take both). (A float key takes text: YAML 1.1 reads ``1e-3`` so.)"""
    if isinstance(data, dict):
        for key, value in data.items():
            field = cls.model_fields.get(key) if isinstance(key, str) else None
            if isinstance(value, bool) and field is not None and _numeric(field.annotation):
                raise ValueError(f"{key}: must be a number, not {str(value).lower()}")
            if isinstance(value, str) and field is not None and _integral(field.annotation):
                shown = value if len(value) <= 20 else value[:17] + "..."
                raise ValueError(f"{key}: must be an integer, not the text {shown!r}")
    return data


class _Section(BaseModel):
    """A config section: unknown keys are errors, not silently ignored; numbers are not booleans."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    _no_bools = model_validator(mode="before")(numbers_are_not_booleans)


# --- trace files ------------------------------------------------------------------------------


class GenericColumns(_Section):
    """Column names (CSV) or keys (JSON lines) of a ``generic`` trace."""

    arrival_time: str
    prompt_tokens: str
    output_tokens: str
    hash_ids: str | None = None  # optional prefix-block ids (a list per row)


class TraceSource(_Section):
    """``trace:`` replay a request trace file.

    ``format``: ``auto`` (tell from the header), ``azure``, ``mooncake``, ``vidur``,
    ``token-ids`` (JSON lines with the prompts' token ids) or ``generic`` (then give ``columns``, and optionally ``time_unit`` - s, ms, us, ns
    or datetime -, ``file_type`` - csv or jsonl, default from the extension - and
    ``hash_block_tokens``). ``on_unsorted``: ``sort`` (with a warning) or ``error``.
    """

    format: Literal["auto", "azure", "mooncake", "vidur", "token-ids", "generic"] = "auto"
    path: str
    on_unsorted: Literal["sort", "error"] = "sort"
    columns: GenericColumns | None = None
    time_unit: Literal["s", "ms", "us", "ns", "datetime"] = "s"
    file_type: Literal["csv", "jsonl"] | None = None
    hash_block_tokens: PositiveInt = 512

    @model_validator(mode="after")
    def _generic_fields_only_for_generic(self) -> TraceSource:
        generic_only = {"columns", "time_unit", "file_type", "hash_block_tokens"}
        if self.format == "generic" and self.columns is None:
            raise ValueError(
                "format 'generic' needs columns: {arrival_time, prompt_tokens, output_tokens}"
            )
        # Judged by value, not by presence: a resolved config written back out carries
        # every key at its default and must load again.
        changed = {k for k in generic_only if getattr(self, k) != type(self).model_fields[k].default}
        if self.format != "generic" and changed:
            raise ValueError(f"{', '.join(sorted(changed))}: allowed only with format 'generic' (not {self.format!r})")
        return self

    def trace_format(self, path: Path) -> str | TraceFormat:
        """The loader's format argument for the file at ``path``."""
        if self.format != "generic":
            return self.format
        assert self.columns is not None
        return generic_format(
            arrival_time=self.columns.arrival_time,
            prompt_tokens=self.columns.prompt_tokens,
            output_tokens=self.columns.output_tokens,
            hash_ids=self.columns.hash_ids,
            time_unit=self.time_unit,
            file_type=self.file_type or file_type_of(path),
            hash_block_tokens=self.hash_block_tokens,
        )


# --- generators: arrivals ---------------------------------------------------------------------


class PoissonArrivalsConfig(_Section):
    """``{kind: poisson, rate}``: exponential gaps, ``rate`` requests/s."""

    kind: Literal["poisson"]
    rate: Rate


class GammaArrivalsConfig(_Section):
    """``{kind: gamma, rate, cv}``: gamma gaps with coefficient of variation ``cv``
    (1 = Poisson, > 1 burstier; vLLM's benchmark burstiness is 1 / cv**2)."""

    kind: Literal["gamma"]
    rate: Rate
    cv: Annotated[float, Field(ge=0.01, le=100, allow_inf_nan=False)]  # (below 0.01: use constant arrivals)


class ConstantArrivalsConfig(_Section):
    """``{kind: constant, rate}``: one request every ``1 / rate`` seconds."""

    kind: Literal["constant"]
    rate: Rate


ArrivalsConfig = Annotated[
    PoissonArrivalsConfig | GammaArrivalsConfig | ConstantArrivalsConfig,
    Field(discriminator="kind"),
]


# --- generators: lengths ----------------------------------------------------------------------


class FixedLengthsConfig(_Section):
    """``{kind: fixed, prompt_tokens, output_tokens}``: every request the same."""

    kind: Literal["fixed"]
    prompt_tokens: TokenCount
    output_tokens: TokenCount


class UniformLengthsConfig(_Section):
    """``{kind: uniform, prompt_min, prompt_max, output_min, output_max}`` (tokens, inclusive)."""

    kind: Literal["uniform"]
    prompt_min: TokenCount
    prompt_max: TokenCount
    output_min: TokenCount
    output_max: TokenCount

    @model_validator(mode="after")
    def _ordered(self) -> UniformLengthsConfig:
        for side in ("prompt", "output"):
            low, high = getattr(self, f"{side}_min"), getattr(self, f"{side}_max")
            if high < low:
                raise ValueError(f"{side}_max ({high}) must be >= {side}_min ({low})")
        return self


class LognormalLengthsConfig(_Section):
    """``{kind: lognormal, prompt_mean, prompt_std, output_mean, output_std}`` (tokens):
    independent lognormals with these means and standard deviations, rounded."""

    kind: Literal["lognormal"]
    prompt_mean: TokenMean
    prompt_std: NonNegativeFloat
    output_mean: TokenMean
    output_std: NonNegativeFloat

    @model_validator(mode="after")
    def _median_is_a_token(self) -> LognormalLengthsConfig:
        """A lognormal of mean m and standard deviation s has median m / sqrt(1 + (s/m)^2): below
        one token, most draws would round up to 1 token and the mean asked for is lost."""
        for side in ("prompt", "output"):
            mean, std = getattr(self, f"{side}_mean"), getattr(self, f"{side}_std")
            median = mean / math.hypot(1, std / mean)
            if median < 1:
                raise ValueError(f"{side}_std ({std:g}) is too wide for {side}_mean ({mean:g}): the median would be "
                                 f"{median:.3g} tokens, so most {side}s would become 1 token (keep the median, "
                                 f"mean / sqrt(1 + (std / mean)^2), at least 1)")
        return self


class PoolLengthsConfig(_Section):
    """``{kind: pool, path}``: sample rows of a lengths file or trace (``format``:
    auto, lengths, azure, mooncake or vidur), keeping each row's prompt and output."""

    kind: Literal["pool"]
    path: str
    format: Literal["auto", "lengths", "azure", "mooncake", "vidur"] = "auto"


class PresetLengthsConfig(_Section):
    """``{kind: preset, name}``: the vLLM paper's ``sharegpt-paper`` (mean 161.31 in,
    337.99 out) or ``alpaca-paper`` (19.31, 58.45); shapes in :mod:`traces.presets`."""

    kind: Literal["preset"]
    name: Literal["sharegpt-paper", "alpaca-paper"]


LengthsConfig = Annotated[
    FixedLengthsConfig
    | UniformLengthsConfig
    | LognormalLengthsConfig
    | PoolLengthsConfig
    | PresetLengthsConfig,
    Field(discriminator="kind"),
]


# --- transforms and sharing -------------------------------------------------------------------


class WindowConfig(_Section):
    """``window:`` keep requests arriving in ``[start_s, start_s + duration_s)``
    (times then count from ``start_s``), then at most the first ``num_requests``."""

    start_s: Seconds = 0.0
    duration_s: Annotated[float, Field(gt=0, le=MAX_SPAN_S, allow_inf_nan=False)] | None = None
    num_requests: Annotated[int, Field(ge=1, le=MAX_REQUESTS)] | None = None

    @model_validator(mode="after")
    def _cuts_something(self) -> WindowConfig:
        if self.start_s == 0 and self.duration_s is None and self.num_requests is None:
            raise ValueError("a window needs start_s > 0, duration_s or num_requests")
        return self


class SharedPrefixConfig(_Section):
    """``shared_prefix:`` a prefix of ``tokens`` tokens (e.g. a system prompt),
    identified by ``prefix_id``, prepended to every prompt (prompts grow by ``tokens``)."""

    prefix_id: str = "shared-prefix"
    tokens: TokenCount


class RangeConfig(_Section):
    """``{min, max}``: an integer drawn uniformly from ``min`` to ``max`` (inclusive)."""

    min: TokenCount
    max: TokenCount

    @model_validator(mode="after")
    def _ordered(self) -> RangeConfig:
        if self.max < self.min:
            raise ValueError(f"max ({self.max}) must be >= min ({self.min})")
        return self

    def pair(self) -> tuple[int, int]:
        return (self.min, self.max)


class MultiTurnConfig(_Section):
    """``multi_turn:`` generated chat conversations whose every turn resends the conversation
    so far (system prompt, earlier user messages and answers) plus a new user message, with
    token ids so prefix caches hit (:mod:`traces.multi_turn`: the layout, what can hit, and
    the open-loop arrival rule)::

        multi_turn:
          conversations: 200             # how many conversations
          conversation_rate: 1.0         # new conversations per second (Poisson)
          turns: {min: 2, max: 6}        # turns per conversation
          system_prompt_tokens: 600      # shared by all conversations (0: none) ...
          system_prompts: 1              # ... or one of this many, picked per conversation
          user_tokens: {min: 50, max: 300}     # new user message per turn
          output_tokens: {min: 100, max: 400}  # answer per turn
          think_time_s: 10.0             # mean pause (exponential) before the next turn ...
          assumed_tpot_s: 0.02           # ... after output_tokens x this (assumed service)
    """

    conversations: PositiveInt
    conversation_rate: Rate
    turns: RangeConfig = RangeConfig(min=2, max=6)
    system_prompt_tokens: Annotated[int, Field(ge=0, le=MAX_MESSAGE_TOKENS)] = 0
    system_prompts: Annotated[int, Field(ge=1, le=1_000_000)] = 1
    user_tokens: RangeConfig = RangeConfig(min=50, max=300)
    output_tokens: RangeConfig = RangeConfig(min=100, max=400)
    think_time_s: Annotated[float, Field(ge=0, le=MAX_THINK_S, allow_inf_nan=False)] = 10.0
    assumed_tpot_s: Annotated[float, Field(ge=0, le=MAX_TPOT_S, allow_inf_nan=False)] = 0.02
    vocab_size: Annotated[int, Field(ge=2, le=MAX_TOKEN_ID + 1)] = LLAMA3_VOCAB

    @model_validator(mode="after")
    def _bounded(self) -> MultiTurnConfig:
        most = self.conversations * self.turns.max
        if most > MAX_REQUESTS:
            raise ValueError(f"conversations x turns.max = {most:.3g} requests is more than one run can hold "
                             f"(at most {MAX_REQUESTS:.0e})")
        span = self.conversations / self.conversation_rate
        if span > MAX_SPAN_S:
            raise ValueError(f"conversations / conversation_rate = {span:.3g} s of arrivals; a workload may last at "
                             f"most {SPAN_TEXT}: raise conversation_rate or lower conversations")
        tokens = self.expected_prompt_tokens()
        if tokens > MAX_PROMPT_TOKENS:
            raise ValueError(f"these conversations would send about {tokens:.3g} prompt tokens in all (each turn "
                             f"resends the conversation so far), more than one run can generate (at most "
                             f"{MAX_PROMPT_TOKENS:.0e}): fewer conversations, turns or tokens per message")
        return self

    def expected_prompt_tokens(self) -> float:
        """The prompt tokens all turns send, on average: turn k's prompt holds the system prompt,
        k user messages and k - 1 answers, so a conversation of t turns sends t x system +
        t(t+1)/2 x user + t(t-1)/2 x answer tokens (t drawn uniformly), plus the system prompts
        drawn once."""
        lo, hi = self.turns.min, self.turns.max
        t = (lo + hi) / 2
        t2 = ((hi - lo + 1) ** 2 - 1) / 12 + t * t  # E[t^2] of a uniform integer
        user = (self.user_tokens.min + self.user_tokens.max) / 2
        answer = (self.output_tokens.min + self.output_tokens.max) / 2
        per_conversation = t * self.system_prompt_tokens + (t2 + t) / 2 * user + (t2 - t) / 2 * answer
        return self.conversations * per_conversation + self.system_prompts * self.system_prompt_tokens

    def spec(self) -> MultiTurnSpec:
        """The generator's parameters."""
        return MultiTurnSpec(
            conversations=self.conversations,
            conversation_rate=self.conversation_rate,
            turns=self.turns.pair(),
            system_prompt_tokens=self.system_prompt_tokens,
            system_prompts=self.system_prompts,
            user_tokens=self.user_tokens.pair(),
            output_tokens=self.output_tokens.pair(),
            think_time_s=self.think_time_s,
            assumed_tpot_s=self.assumed_tpot_s,
            vocab_size=self.vocab_size,
        )


class WorkloadConfig(_Section):
    """``workload:`` where requests come from and how they are shaped.

    Source, exactly one of:
      * ``trace``: a :class:`TraceSource`;
      * ``arrivals`` + ``lengths`` (+ ``num_requests`` and/or ``duration_s``, the
        generator stops at whichever comes first);
      * ``multi_turn``: a :class:`MultiTurnConfig` (chat conversations with token ids).

    Transforms:
      * ``sharegpt_filter``: vLLM's benchmark filter (drop prompt or output < 4,
        prompt > 1024 or prompt + output > 2048 tokens); with a generator, lengths
        are redrawn instead, so the arrival process is unchanged;
      * ``rate_scale``: arrival-rate multiplier (2.0 = twice as fast);
      * ``window``: a :class:`WindowConfig`, in scaled time;
      * ``too_long``: ``reject`` (the default; the simulator rejects requests longer
        than the model's max length and records why) or ``clip`` (shorten them here).

    Sharing, applied to every request: ``n`` parallel samples, ``beam_width`` beams
    (``n <= beam_width`` when both > 1), ``shared_prefix``.
    """

    trace: TraceSource | None = None
    arrivals: ArrivalsConfig | None = None
    lengths: LengthsConfig | None = None
    num_requests: PositiveInt | None = None
    duration_s: PositiveFloat | None = None
    sharegpt_filter: bool = False
    rate_scale: Annotated[float, Field(gt=0, le=MAX_RATE, allow_inf_nan=False)] = 1.0
    window: WindowConfig | None = None
    too_long: Literal["reject", "clip"] = "reject"
    n: Annotated[int, Field(ge=1, le=MAX_GROUP)] = 1
    beam_width: Annotated[int, Field(ge=1, le=MAX_GROUP)] = 1
    shared_prefix: SharedPrefixConfig | None = None
    multi_turn: MultiTurnConfig | None = None

    @model_validator(mode="after")
    def _one_source(self) -> WorkloadConfig:
        generator_keys = ("arrivals", "lengths", "num_requests", "duration_s")
        if self.multi_turn is not None:
            given = [k for k in ("trace", *generator_keys, "shared_prefix") if getattr(self, k) is not None]
            if self.sharegpt_filter:
                given.append("sharegpt_filter")
            if self.rate_scale != 1.0:
                given.append("rate_scale (set multi_turn.conversation_rate)")
            if given:
                raise ValueError(f"a multi_turn workload makes its own requests and token ids; remove "
                                 f"{', '.join(given)}")
        elif self.trace is not None:
            given = [k for k in generator_keys if getattr(self, k) is not None]
            if given:
                raise ValueError(
                    f"a trace workload takes arrivals and lengths from its file; remove "
                    f"{', '.join(given)} (use window to cut the trace)"
                )
            has_hashes = self.trace.format == "mooncake" or (
                self.trace.columns is not None and self.trace.columns.hash_ids is not None
            )
            if self.shared_prefix is not None and has_hashes:
                raise ValueError("shared_prefix cannot be added to a trace with hash_ids")
            if self.shared_prefix is not None and self.trace.format == "token-ids":
                raise ValueError("shared_prefix cannot be added to a trace with token ids")
        else:
            if self.arrivals is None or self.lengths is None:
                raise ValueError(
                    "a workload needs either trace: {format, path} or arrivals: {kind, rate} "
                    "and lengths: {kind, ...}"
                )
            if self.num_requests is None and self.duration_s is None:
                raise ValueError("a generated workload needs num_requests and/or duration_s")
            rate = self.arrivals.rate * self.rate_scale
            by_time = None if self.duration_s is None else rate * self.duration_s
            expected = min(x for x in (self.num_requests, by_time) if x is not None)  # it stops at the first
            if expected > MAX_REQUESTS:
                what = (f"num_requests {self.num_requests}" if expected == self.num_requests else
                        f"rate x rate_scale x duration_s = {expected:.3g} requests")
                raise ValueError(f"{what} is more than one run can hold (at most {MAX_REQUESTS:.0e}: "
                                 "each request keeps a row of the request table, ~0.6 KB of memory)")
            span = expected / rate
            if span > MAX_SPAN_S:
                raise ValueError(f"{expected:.3g} requests at arrivals.rate x rate_scale = {rate:.3g} req/s arrive "
                                 f"over {span:.3g} s; a workload may last at most {SPAN_TEXT}: raise the rate")
        if self.n > 1 and self.beam_width > 1 and self.n > self.beam_width:
            raise ValueError(f"n ({self.n}) must be <= beam_width ({self.beam_width})")
        return self


# --- building requests ------------------------------------------------------------------------

SOURCE_ROOT = Path(traces.__file__).resolve().parent.parent
"""The folder holding the ``traces`` package: the repository root in a checkout."""


def resolve_data_path(path: str | Path, base_dir: Path | None = None, *, key: str = "path") -> Path:
    """Find a data file: absolute, or relative to the current folder, ``base_dir``
    (the config file's folder), the kvsim source root, or the shipped ``traces/data``
    (the whole relative path under each: a shipped file that only shares the name is not it).

    Raises FileNotFoundError naming the config ``key`` and every place looked in.
    """
    given = Path(path).expanduser()
    if given.is_absolute():
        candidates = [given]
    else:
        roots = [Path.cwd(), base_dir and base_dir.resolve(), SOURCE_ROOT, traces.DATA_DIR]
        candidates = [root / given for root in roots if root is not None]
    for candidate in candidates:
        if candidate.is_file():
            return candidate
    looked = ", ".join(dict.fromkeys(str(c) for c in candidates))
    raise FileNotFoundError(f"{key}: file {str(path)!r} not found; looked in: {looked}")


def build_requests(
    cfg: WorkloadConfig, *, base_dir: Path, seed: int, max_seq_len: int | None = None
) -> Iterator[Request]:
    """The workload's requests, lazily, in arrival order, numbered 0, 1, 2, ...

    Files are found, formats detected and length pools loaded now (so a bad path
    fails before the simulation starts); rows are read as the iterator is consumed.
    ``seed`` fixes every random draw of a generator. ``max_seq_len`` (tokens) is
    needed only with ``too_long: clip``; with ``reject`` requests pass unchanged and
    the simulator rejects the ones that are too long.
    """
    if cfg.too_long == "clip" and max_seq_len is None:
        raise ValueError("workload.too_long = 'clip' needs the model's max_seq_len (model.context_len_tokens)")
    if cfg.trace is not None:
        path = resolve_data_path(cfg.trace.path, base_dir, key="workload.trace.path")
        stream = load_trace(path, cfg.trace.trace_format(path), on_unsorted=cfg.trace.on_unsorted)
        if cfg.sharegpt_filter:
            stream = sharegpt_filter(stream)
        stream = scale_rate(stream, cfg.rate_scale)
        if cfg.rate_scale < 1:  # slowed down: the trace's span grows
            stream = _within_span(stream, path, cfg.rate_scale)
    elif cfg.multi_turn is not None:
        stream = generate_multi_turn(cfg.multi_turn.spec(), seed=seed)
    else:
        assert cfg.arrivals is not None and cfg.lengths is not None
        lengths = make_length_sampler(cfg.lengths, base_dir)
        if cfg.sharegpt_filter:
            lengths = FilteredLengths(lengths, sharegpt_keep_array)
        stream = generate_requests(
            make_arrival_process(cfg.arrivals, cfg.rate_scale),
            lengths,
            seed=seed,
            num_requests=cfg.num_requests,
            duration_s=cfg.duration_s,
        )
    if cfg.window is not None:
        if cfg.window.start_s > 0 or cfg.window.duration_s is not None:
            stream = window_by_time(stream, cfg.window.start_s, cfg.window.duration_s)
        if cfg.window.num_requests is not None:
            stream = window_by_count(stream, cfg.window.num_requests)
    prefix = cfg.shared_prefix
    stream = apply_sharing(
        stream,
        n=cfg.n,
        beam_width=cfg.beam_width,
        prefix_id=prefix.prefix_id if prefix else None,
        prefix_tokens=prefix.tokens if prefix else 0,
    )
    if cfg.too_long == "clip":
        stream = clip_to_max_len(stream, max_seq_len)
    return stream


def _within_span(requests: Iterator[Request], path: Path, rate_scale: float) -> Iterator[Request]:
    """The requests, refusing one that arrives later than a workload may last."""
    for r in requests:
        if r.arrival_time > MAX_SPAN_S:
            raise TraceError(path, None, f"workload.rate_scale {rate_scale:g} stretches the trace to {r.arrival_time:.3g} s; a "
                             f"workload may last at most {SPAN_TEXT}: raise rate_scale")
        yield r


def make_arrival_process(cfg: ArrivalsConfig, rate_scale: float = 1.0) -> ArrivalProcess:
    """The arrival process a config describes, its rate multiplied by ``rate_scale``."""
    rate = cfg.rate * rate_scale
    if isinstance(cfg, GammaArrivalsConfig):
        return GammaArrivals(rate, cfg.cv)
    if isinstance(cfg, ConstantArrivalsConfig):
        return ConstantArrivals(rate)
    return PoissonArrivals(rate)


def make_length_sampler(cfg: LengthsConfig, base_dir: Path | None = None) -> LengthSampler:
    """The length sampler a config describes (a pool file is loaded now)."""
    if isinstance(cfg, FixedLengthsConfig):
        return FixedLengths(cfg.prompt_tokens, cfg.output_tokens)
    if isinstance(cfg, UniformLengthsConfig):
        return UniformLengths(cfg.prompt_min, cfg.prompt_max, cfg.output_min, cfg.output_max)
    if isinstance(cfg, LognormalLengthsConfig):
        return LognormalLengths(cfg.prompt_mean, cfg.prompt_std, cfg.output_mean, cfg.output_std)
    if isinstance(cfg, PoolLengthsConfig):
        path = resolve_data_path(cfg.path, base_dir, key="workload.lengths.path")
        prompts, outputs = load_length_pool(path, cfg.format)
        return PoolLengths(prompts, outputs)
    return preset_lengths(cfg.name)


__all__ = [
    "WorkloadConfig",
    "build_requests",
    "make_arrival_process",
    "make_length_sampler",
    "resolve_data_path",
]
