"""A request in flight: a group of sequences (one, ``n`` samples or beams) sharing a prompt."""

from __future__ import annotations

import enum
from collections.abc import Hashable, Sequence
from dataclasses import dataclass

from kvsim.traces import Request


class Status(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    SWAPPED = "swapped"
    FINISHED = "finished"
    REJECTED = "rejected"
    ABORTED = "aborted"


TERMINAL = (Status.FINISHED, Status.REJECTED, Status.ABORTED)


class DecodeClock:
    """Decode steps one replica has run (each gives every running group a token)."""

    __slots__ = ("ticks",)

    def __init__(self) -> None:
        self.ticks = 0


@dataclass(eq=False, slots=True)
class SequenceGroup:
    """One request's sequences and its life story (times in seconds of simulated time).

    All live sequences of a group generate in lockstep, so ``generated`` is the
    group's count of output tokens per sequence; sequence ``s`` is done when
    ``generated == targets[s]``.
    """

    request: Request
    seq_ids: list[int]  # live sequences, still generating
    targets: dict[int, int]  # seq -> output tokens it will generate in total
    prompt_len: int  # tokens the next prefill computes (grows on recompute)
    status: Status = Status.WAITING
    #: output tokens per live sequence, less ``clock.ticks`` while RUNNING: every running
    #: group gains one token per decode step, so the scheduler moves one clock, not each group
    gen_base: int = 0
    clock: DecodeClock | None = None
    due: int = 0  # while RUNNING: the clock tick at which its next sequence finishes
    fresh: bool = False  # joined the running batch (prefill, swap-in) since the last decode step
    # metrics
    first_scheduled: float | None = None
    first_token: float | None = None
    last_token: float = 0.0
    finish: float | None = None
    preemptions: int = 0
    recomputed_tokens: int = 0
    swapped_out_blocks: int = 0
    swapped_in_blocks: int = 0
    reason: str | None = None  # why rejected or aborted
    prefix: Sequence[Hashable] = ()  # contents of shareable leading prompt blocks
    cached_tokens: int = 0  # prompt tokens found in the prefix cache at the last prefill
    total_output_tokens: int = 0  # output tokens over all samples / beams (sum of targets)
    beam_width: int = 1  # > 1: beams are re-chosen every step
    next_finish: int = 0  # fewest output tokens among live sequences: the group's next finish
    recomputing: bool = False  # preempted by recomputation and not yet prefilled again
    admitted: int = 0  # vllm-v1: its rank in the running list's admission order (last admission)
    # cache tiers (vllm-v1; policies.tiers.tier_stack)
    loaded_tokens: int = 0  # tokens loaded from lower cache tiers, all loads
    load_wait: float = 0.0  # seconds spent loading before the first token (TTFT's load part)
    after_load: bool = False  # back from a load: its next admission counts no lookups or hits

    def back_from_load(self, tokens: int, start: float, done: float) -> None:
        """A load of ``tokens`` from a cache tier, from ``start`` to ``done`` (s), ended: it
        counts toward TTFT's load part if no token came yet, and the next admission counts
        no lookups or hits (they were counted when the load started)."""
        self.loaded_tokens += tokens
        if self.first_token is None:
            self.load_wait += done - start
        self.after_load = True

    def end(self, status: Status, reason: str | None, now: float) -> None:
        """The request ends with ``status`` (``reason``: why, when not finished); it finishes
        at ``now`` (s) unless its last token already set the finish."""
        self.status = status
        self.reason = reason
        if self.finish is None:
            self.finish = now

    @property
    def generated(self) -> int:
        """Output tokens each live sequence has so far."""
        if self.status is Status.RUNNING:
            return self.gen_base + self.clock.ticks
        return self.gen_base

    @property
    def arrival(self) -> float:
        return self.request.arrival_time

    @property
    def sort_key(self) -> tuple[float, int]:
        return (self.request.arrival_time, self.request.request_id)

    @property
    def num_live(self) -> int:
        return len(self.seq_ids)

    @classmethod
    def single(cls, request: Request, seq_id: int, clock: DecodeClock) -> SequenceGroup:
        """The usual group: one sequence ``seq_id`` generating the request's output."""
        out = request.output_tokens
        return cls(request, [seq_id], {seq_id: out}, request.prompt_tokens, clock=clock,
                   total_output_tokens=out, next_finish=out)

    def final_len(self, seq_id: int) -> int:
        """KV tokens the sequence will hold at its end: prompt + output - 1 (the last token's KV is never written)."""
        return self.request.prompt_tokens + self.targets[seq_id] - 1

    @property
    def max_output(self) -> int:
        return max(self.targets.values())
