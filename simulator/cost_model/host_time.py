"""Host time: the engine's work outside the GPU kernels, per step and per sequence.

Every iteration the engine schedules (picks sequences, allocates blocks), prepares the
model's inputs (token ids, positions, block tables, copied to the GPU), samples the next
tokens and processes the outputs (appends tokens, checks stop conditions, detokenizes).
An engine that does this on the critical path adds it to every step::

    host_s = per_step_s + per_seq_s x sequences      (sequences scheduled in the step)

It is a part of step time of its own (``StepParts.host_s``), never folded into a kernel
efficiency or an operator table. Where an operator profile already times the sampler
(a ``sampler`` per-sequence table), the sampling share of a preset (``sampling_per_step_s``,
``sampling_per_seq_s``) is dropped so it is not counted twice.

Presets (``cost_model.host``; the default ``none`` adds nothing, so results without the key
are those of the kernels alone):

- ``none``: no host time. Today's engines (vLLM v1's asynchronous scheduling and CUDA
  graphs, SGLang's overlap scheduler) hide most of it behind the GPU's work, and the
  shipped RTX 4090 run shows none beyond its kernels.
- ``vllm-2023-a100``: vLLM as Vidur profiled it (2023-24, synchronous, one step's host
  work after another's kernels), on an A100 with Llama-2-7B, tensor parallel 1: Vidur's
  ``data/profiling/a100/cpu_overheads.csv`` (microsoft/vidur), mean milliseconds per step of
  SCHEDULE, SAMPLER_E2E, PREPARE_INPUTS_E2E and PROCESS_MODEL_OUTPUTS at batch 8 and batch
  64; the line through the two (sum: 3.0 ms at 8, 12.6 ms at 64). SAMPLER_E2E's line is the
  sampling share.
"""

from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True)
class HostTime:
    """Seconds of host work per step and per scheduled sequence; ``sampling_*`` is the part
    of them that is sampling (dropped when a profile times the sampler itself)."""

    per_step_s: float = 0.0
    per_seq_s: float = 0.0
    sampling_per_step_s: float = 0.0
    sampling_per_seq_s: float = 0.0

    def __post_init__(self):
        for k in ("per_step_s", "per_seq_s", "sampling_per_step_s", "sampling_per_seq_s"):
            if not getattr(self, k) >= 0:
                raise ValueError(f"cost_model.host.{k}: must be >= 0 seconds (got {getattr(self, k)!r})")
        if self.sampling_per_step_s > self.per_step_s or self.sampling_per_seq_s > self.per_seq_s:
            raise ValueError("cost_model.host: the sampling share cannot exceed the whole (sampling_per_step_s <= "
                             "per_step_s, sampling_per_seq_s <= per_seq_s)")

    def seconds(self, sequences: int) -> float:
        """Host seconds of a step scheduling ``sequences`` sequences (0 for an empty step)."""
        return self.per_step_s + self.per_seq_s * sequences if sequences > 0 else 0.0

    def without_sampling(self) -> HostTime:
        """The host work left when the sampler is timed elsewhere (an operator profile)."""
        return replace(self, per_step_s=self.per_step_s - self.sampling_per_step_s,
                       per_seq_s=self.per_seq_s - self.sampling_per_seq_s,
                       sampling_per_step_s=0.0, sampling_per_seq_s=0.0)

    @property
    def zero(self) -> bool:
        return self.per_step_s == 0 and self.per_seq_s == 0


NO_HOST = HostTime()

HOST_PRESETS: dict[str, HostTime] = {
    "none": NO_HOST,
    # Vidur cpu_overheads.csv (A100, Llama-2-7B, TP 1), means in ms, batch 8 -> 64:
    # SCHEDULE 0.1648 -> 0.8541, SAMPLER_E2E 0.8792 -> 1.3195, PREPARE_INPUTS_E2E 0.3521 -> 1.3231,
    # PROCESS_MODEL_OUTPUTS 1.5873 -> 9.0616; the line through both batch sizes (rounded to 3 figures).
    "vllm-2023-a100": HostTime(per_step_s=1.62e-3, per_seq_s=1.71e-4,
                               sampling_per_step_s=8.16e-4, sampling_per_seq_s=7.86e-6),
}


def host_preset(name: str) -> HostTime:
    """The host time a preset names; a ValueError lists the known ones."""
    try:
        return HOST_PRESETS[name]
    except KeyError:
        raise ValueError(f"unknown host preset {name!r}; allowed: {', '.join(HOST_PRESETS)} or "
                         "{per_step_s, per_seq_s}") from None
