"""The reference engine: vLLM v0's and v1's scheduling rules, one SimPy step per iteration
(``simulator.reference.simulation`` runs them: the trace, the router and every replica).

This is the oracle the fast engine (``simulator.engine.simulation`` with its scheduler, macro-steps,
lazy block tables and closed forms) is tested against, and the place to learn the rules
(DESIGN.md, "Engine and scheduler" and "Performance principle, and the reference"). It
shares only plain data with the fast path: ``traces.Request``, the config, the cost
model and the decoding models (sample lengths, beam parent choice). The allocators are
``policies.reference.paged`` and ``policies.reference.contiguous``.

Each replica's engine is the loop it simulates::

    while there is work:
        step = replica.schedule(now)        # pick the batch, allocate KV
        record the step's memory
        yield env.timeout(step time)        # the GPU computes it
        replica.complete(step, now)         # every sequence in it gains a token

The rules of ``schedule`` (vLLM v0):

1. Nothing swapped out (and, with request-level batching, nothing running): admit waiting
   groups first come first served while ``max_num_seqs``, ``max_num_batched_tokens`` and
   free memory above the watermark allow. A step that admits prompts is prefill-only.
2. Otherwise a decode step: oldest first, every running group appends one slot per
   sequence; when memory runs out, preempt the latest-arrived running group (all its
   sequences), repeatedly, until the rest fit.
3. If nothing was preempted, swapped-out groups come back oldest first while
   ``max_num_seqs`` and free memory above the watermark (plus a slot per sequence) allow;
   they decode in the same step.

Preemption: a multi-sequence group is swapped (its samples or beams cannot be recomputed
from the prompt alone); a single sequence is recomputed under ``recompute`` and ``auto``,
swapped under ``swap``. A recomputed group rejoins the front of the waiting queue with
its generated tokens folded into its prompt. When the CPU pool is full a swap falls back
to recomputation, or aborts the request (``abort``, and always for multi-sequence groups).

``scheduler.policy: vllm-v1`` replaces these rules by vLLM v1's (``ReferenceV1Replica``: a
per-step token budget, chunked prefills mixed with decodes, recompute-only preemption of the
most recently admitted request) over ``policies.reference.paged.ReferenceFreeQueueAllocator``
(one free queue, lazy eviction of cached blocks). ``scheduler.policy: sglang`` runs
``simulator.reference.sglang.ReferenceSGLangReplica`` (SGLang's queue orders, reservation,
retraction and chunked prefill) over ``policies.reference.radix.ReferenceRadixCache``.

Cache tiers below the GPU (``allocator.tiers``, vllm-v0, vllm-v1 and sglang): ``ReferenceTiers``
keeps each replica's tiers (``policies.reference.tier.PlainTier``) behind SimPy links, one
process per transfer. A waiting request whose prefix continues in a tier *loads* it instead
of being admitted (``ReferenceReplica.load_head``, ``ReferenceV1Replica.start_load``: it
holds its GPU hit and fresh blocks, waits outside both queues, and returns to the front of
the waiting queue when its last transfer ends); stores follow each tier's write policy, in
one batch at the end of each scheduling and one at the end of each step. Under vllm-v0 the
head is looked up after the never-fits check and before the batch limits (a load takes no
batch slot), the load's blocks must fit above the watermark, and write-through stores the
prompt blocks a prefill computed past its hit. With tiers the engine yields once before each scheduling
(``timeout(0)``) so that transfers ending at that instant end first.
"""

from __future__ import annotations

import bisect
import math
from collections import deque
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field

import numpy as np
import simpy

from kvsim.policies.reference.paged import (
    NEVER,
    NO_SPACE,
    OK,
    blocks_for,
)
from kvsim.policies.reference.tier import PlainTier, TierEntry
from kvsim.simulator.cost_model.base import BatchShape, CostModel
from kvsim.simulator.decoding import beam_parent_counts, sample_targets
from kvsim.traces import Request

CLASSES = (
    "token_states",
    "reserved",
    "internal_frag",
    "allocator_frag",
    "external_frag",
    "stranded_free",
    "idle_free",
)


class ReferenceStalled(RuntimeError):
    """Work remains but nothing can ever be scheduled."""


# --- a request in flight ----------------------------------------------------------------
@dataclass(eq=False)
class Group:
    """One request's live sequences (one, ``n`` samples or beams) and its story (seconds)."""

    request: Request
    seqs: list[int]  # live sequences, best beam first
    targets: dict[int, int]  # sequence -> output tokens it generates in all
    prompt_len: int  # tokens the next prefill computes (grows on recompute)
    prefix: list[Hashable]  # names of the prompt's leading full blocks (prefix caching)
    generated: int = 0  # output tokens per live sequence so far
    status: str = "waiting"
    recomputing: bool = False
    scheduled_s: float | None = None
    first_token_s: float | None = None
    last_token_s: float = 0.0  # when its sequences last gained a token
    finish_s: float | None = None
    preemptions: int = 0
    recomputed_tokens: int = 0
    swapped_out_blocks: int = 0
    swapped_in_blocks: int = 0
    cached_tokens: int = 0
    loaded_tokens: int = 0  # tokens loaded from cache tiers (allocator.tiers)
    load_wait_s: float = 0.0  # seconds spent loading before its first token
    after_load: bool = False  # back from a load: its next admission counts no lookups, no hits
    reason: str | None = None

    @property
    def key(self) -> tuple[float, int]:
        return (self.request.arrival_time, self.request.request_id)

    def final_len(self, s: int) -> int:
        """Tokens the sequence finally stores: prompt + output - 1 (the last token's KV is
        never written)."""
        return self.request.prompt_tokens + self.targets[s] - 1


def prompt_block_names(request: Request, block_size: int) -> list[Hashable]:
    """Names of the prompt's leading full blocks that other requests may share: with the
    prompt's ``token_ids``, every full block is named by its tokens; a Mooncake hash id names
    ``hash_block_tokens`` tokens; a ``prefix_id`` its ``prefix_tokens``. (The allocator chains
    the names: a block's key is made of its parent's key and its name, so two prompts share
    block j exactly when they agree up to its end.)"""
    token_ids = getattr(request, "token_ids", None)
    if token_ids is not None:
        full = len(token_ids) // block_size
        return [
            ("tokens", tuple(token_ids[j * block_size : (j + 1) * block_size])) for j in range(full)
        ]
    if request.hash_ids:
        hb = request.hash_block_tokens
        if hb % block_size:
            raise ValueError(
                f"block size {block_size} does not divide the trace's hash block of {hb} tokens"
            )
        covered = min(len(request.hash_ids) * hb, request.prompt_tokens)
        return [
            ("hash", request.hash_ids[j * block_size // hb], j * block_size % hb)
            for j in range(covered // block_size)
        ]
    if request.prefix_id is not None and request.prefix_tokens:
        shared = min(request.prefix_tokens, request.prompt_tokens)
        return [("prefix", request.prefix_id, j) for j in range(shared // block_size)]
    return []


def sequence_block_names(request: Request, block_size: int) -> list[Hashable]:
    """Names of a vLLM v1 request's leading full blocks, prompt then output: the prompt's
    (``prompt_block_names``) and, when the request knows its answer (``output_token_ids``,
    after a prompt named by its ``token_ids``), every full block of prompt + answer by its
    tokens, so a later prompt that resends both (a conversation's next turn) finds them.
    Blocks past these names are the request's own (``ReferenceV1Replica.block_keys``)."""
    answer = getattr(request, "output_token_ids", None)
    if request.token_ids is None or answer is None:
        return prompt_block_names(request, block_size)
    tokens = tuple(request.token_ids) + tuple(answer)
    return [
        ("tokens", tokens[j * block_size : (j + 1) * block_size])
        for j in range(len(tokens) // block_size)
    ]


@dataclass
class Step:
    """One iteration's batch and the memory traffic it caused."""

    prefill: list[Group] = field(default_factory=list)
    decode: list[Group] = field(default_factory=list)
    prefill_tokens: int = 0  # prompt tokens computed (cached ones excluded)
    prefill_pairs: float = 0.0  # attention query-key pairs of the prefills (causal)
    recompute_tokens: int = 0
    cached_tokens: int = 0
    decode_seqs: int = 0
    decode_context: int = 0  # tokens the decode sequences attend to
    preempted_swap: int = 0
    preempted_recompute: int = 0
    aborted: int = 0
    swap_out_blocks: int = 0
    swap_in_blocks: int = 0
    swap_out_slots: int = 0
    swap_in_slots: int = 0
    cow_copies: int = 0
    chunks: list[tuple[Group, int]] = field(default_factory=list)  # vllm-v1: (request, tokens)

    @property
    def preempted(self) -> int:
        return self.preempted_swap + self.preempted_recompute + self.aborted

    def shape(self) -> BatchShape:
        return BatchShape(
            prefill_seqs=len(self.prefill),
            prefill_tokens=self.prefill_tokens,
            prefill_attn_pairs=self.prefill_pairs,
            decode_seqs=self.decode_seqs,
            decode_context=self.decode_context,
        )


@dataclass(frozen=True)
class Rules:
    """What one replica's scheduler decides by (tokens, slots)."""

    max_num_seqs: int
    max_num_batched_tokens: int
    max_seq_len: int
    watermark_slots: int
    request_level_batching: bool
    preemption: str  # recompute | swap | auto
    swap_fallback: str  # recompute | abort
    sample_lengths: str
    beam_concentration: float
    policy: str = "vllm-v0"  # vllm-v0 | vllm-v1 | sglang
    long_prefill_token_threshold: int = 0  # v1: most tokens one request computes a step (0: no cap)
    max_num_partial_prefills: int | None = None  # v1: most requests left mid-prefill by a step
    reserve_full_isl: bool = True  # v1: admit only if blocks for the whole sequence are free
    schedule_policy: str = "lpm"  # sglang: waiting-queue order (simulator.reference.sglang)
    chunked_prefill_size: int | None = 8192  # sglang: prompt tokens per step in chunks
    enable_mixed_chunk: bool = False  # sglang: running requests decode in prefill steps
    schedule_conservativeness: float = 1.0  # sglang: scales the initial new_token_ratio


# --- one replica's scheduler ----------------------------------------------------------------
class ReferenceReplica:
    """The waiting, running and swapped queues of one replica, and its allocator."""

    def __init__(
        self,
        index: int,
        alloc,
        cost: CostModel,
        rules: Rules,
        seed: int,
        on_end: Callable[[Group, int], None],
    ):
        self.index, self.alloc, self.cost, self.rules = index, alloc, cost, rules
        self.on_end = on_end
        self.rng = np.random.default_rng(seed)
        self.waiting: deque[Group] = deque()
        self.running: list[Group] = []  # by arrival
        self.swapped: list[Group] = []  # by arrival
        self.blocked: str | None = None  # why the head of the waiting queue was not admitted
        self.next_seq = 0
        self.now = 0.0
        self.outstanding_tokens = 0  # prompt + output tokens of requests not yet ended
        self.outstanding_requests = 0  # requests routed here and not yet ended
        self.wake_event: simpy.Event | None = None
        self.itl: list[tuple[float, int]] = []  # (gap between a sequence's tokens, s; sequences)
        self.tiers: ReferenceTiers | None = None  # allocator.tiers
        self.loading: list[Group] = []  # requests loading from a tier: neither waiting nor running
        self.computed: list[Entry] = []  # vllm-v0: prompt blocks this step's prefills compute (tiers)
        self.wake: Callable[[], None] = lambda: None  # wakes this replica's engine (set by the simulation)

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running or self.swapped)

    def send_stores(self) -> None:
        """End of a scheduling: with cache tiers, its GPU evictions join the tiers' batch and
        the batch is stored, after the loads this scheduling started (every reference engine)."""
        if self.tiers is not None:
            self.tiers.gpu_evicted(self.alloc.evicted)
            self.alloc.evicted = []
            self.tiers.flush_scheduling()

    def add(self, request: Request, now: float) -> None:
        """A request arrives: it waits, or is rejected if it can never run."""
        self.now = now
        k, rules = request.num_seqs, self.rules
        seqs = list(range(self.next_seq, self.next_seq + k))
        self.next_seq += k
        if k > 1 and request.beam_width == 1:
            outputs = sample_targets(request, rules.sample_lengths, self.rng, rules.max_seq_len)
        else:
            outputs = [request.output_tokens] * k
        prefix = (
            prompt_block_names(request, self.alloc.block_size)
            if getattr(self.alloc, "prefix_caching", False)
            else []
        )
        g = Group(request, seqs, dict(zip(seqs, outputs)), request.prompt_tokens, prefix)
        longest = request.prompt_tokens + max(outputs)
        if k > rules.max_num_seqs:
            self.end(g, "rejected", f"{k} sequences exceed max_num_seqs {rules.max_num_seqs}")
        elif longest > rules.max_seq_len:
            self.end(
                g,
                "rejected",
                f"prompt + output = {longest} tokens exceeds the context window "
                f"(model.context_len_tokens) {rules.max_seq_len}",
            )
        else:
            self.waiting.append(g)

    # --- one iteration ------------------------------------------------------------------------
    def schedule(self, now: float) -> Step:
        self.now = now
        step = Step()
        if not self.swapped and not (self.rules.request_level_batching and self.running):
            self.admit(step)
        elif self.waiting:
            self.blocked = "swapped" if self.swapped else "batch"
        if not step.prefill:  # (a step that admits prompts is prefill-only)
            self.decode(step)
        self.send_stores()
        return step

    def admit(self, step: Step) -> None:
        """Rule 1: FCFS admission under the batch limits and the watermark."""
        alloc, rules = self.alloc, self.rules
        self.blocked = None
        seqs = sum(len(g.seqs) for g in self.running)
        while self.waiting:
            g = self.waiting[0]
            finals = [g.final_len(s) for s in g.seqs]
            verdict = alloc.can_admit(g.prompt_len, finals, rules.watermark_slots, g.prefix)
            if verdict == NEVER:
                self.waiting.popleft()
                why = getattr(alloc, "never_reason", None)  # (a contiguous region too small)
                self.end(g, "rejected", (why and why(g.prompt_len, finals))
                         or f"needs more KV slots than the whole cache ({alloc.capacity})")
                continue
            if self.tiers is not None:
                loading = self.load_head(g)
                if loading is None:  # its blocks in a tier do not fit above the watermark
                    self.blocked = NO_SPACE
                    return
                if loading:
                    continue
            if verdict != OK:
                self.blocked = verdict
                return
            if (
                step.prefill_tokens + g.prompt_len > rules.max_num_batched_tokens
                or seqs + len(g.seqs) > rules.max_num_seqs
            ):
                self.blocked = "limits"
                return
            self.waiting.popleft()
            if self.tiers is None:
                cached = alloc.admit(g.seqs, g.prompt_len, finals, g.prefix)
            else:
                cached = self.admit_with_tiers(g, finals)
            new = g.prompt_len - cached
            g.cached_tokens = cached
            step.cached_tokens += cached
            step.prefill_tokens += new
            # Causal attention: new token i attends to the cached tokens and i new ones.
            step.prefill_pairs += new * cached + new * (new + 1) / 2
            if g.recomputing:
                step.recompute_tokens += new
                g.recomputing = False
            seqs += len(g.seqs)
            self.start_running(g)
            step.prefill.append(g)

    # --- cache tiers (vllm-v0) ---------------------------------------------------------------------
    def load_head(self, g: Group) -> bool | None:
        """The head ``g`` looks its prompt's blocks up past its GPU hit in the cache tiers. None
        found: False (admission goes on as usual). Found: if the GPU has free blocks for them
        and for its hits only the cache holds, above the watermark, it loads them (holding its
        hits and fresh blocks, counted as an admission's lookup and hits) and waits outside the
        queues: True; else None (admission stops)."""
        alloc, B = self.alloc, self.alloc.block_size
        keys, hits = alloc.prefix_keys(g.prefix), alloc.cache_hits(g.prefix)
        h = len(hits)
        found = self.tiers.lookup(keys[h:])
        if not found:
            return False
        k = len(found)
        need = k + sum(1 for b in hits if alloc.holders[b] == 0)
        if alloc.num_free() - need < self.rules.watermark_slots // B:
            return None
        self.waiting.popleft()
        g.after_load = False
        self.tier_gpu_hits(keys[:h], g.request.priority)
        alloc.start_load(g.seqs[0], g.prefix, k)
        g.status = "loading"
        self.loading.append(g)
        loaded, start = keys[h : h + k], self.now
        self.tiers.start_load(loaded, found, g.request.priority,
                              lambda done_s: self.load_ended(g, loaded, start, done_s))
        return True

    def load_ended(self, g: Group, keys: list[int], start_s: float, done_s: float) -> None:
        """The last transfer of ``g``'s load ended at ``done_s``: its loaded blocks are cached
        under ``keys`` and released with its hits (they stay cached); it goes back to the
        front of the waiting queue, where its next admission hits them."""
        self.alloc.finish_load(g.seqs[0], keys, g.request.priority)
        self.back_from_load(g, len(keys), start_s, done_s)

    def back_from_load(self, g: Group, blocks: int, start_s: float, done_s: float) -> None:
        """``g``'s load of ``blocks`` blocks, from ``start_s`` to ``done_s``, ended (its
        blocks are released): it counts toward TTFT's load part if no token came yet, goes
        back to the front of the waiting queue, and its next admission counts no lookups."""
        self.loading.remove(g)
        g.loaded_tokens += blocks * self.alloc.block_size
        if g.first_token_s is None:
            g.load_wait_s += done_s - start_s
        g.after_load = True
        g.status = "waiting"
        self.waiting.insert(0, g)  # (a deque, or sglang's list)
        self.wake()

    def admit_with_tiers(self, g: Group, finals: list[int]) -> int:
        """Admit ``g`` with cache tiers below: its GPU hits count toward after-hits (unless
        it is back from a load: counted then), and the prompt blocks it computes past its hit
        are written through when the step ends."""
        alloc, p = self.alloc, g.request.priority
        keys, h = alloc.prefix_keys(g.prefix), len(alloc.cache_hits(g.prefix))
        counted, g.after_load = not g.after_load, False
        if counted:
            self.tier_gpu_hits(keys[:h], p)
        self.computed += [(x, alloc.parents[x], p) for x in keys[h:]]
        return alloc.admit(g.seqs, g.prompt_len, finals, g.prefix, priority=p, counted=counted)

    def tier_gpu_hits(self, keys: list[int], priority: int) -> None:
        """An admission (or a load) hit ``keys`` in the GPU cache: the tiers count them
        (write-through-after-hits), each with its parent and the request's ``priority``."""
        if keys:
            self.tiers.gpu_hits([(x, self.alloc.parents[x], priority) for x in keys])

    def decode(self, step: Step) -> None:
        """Rules 2 and 3: every running sequence appends a slot; preempt; swap in."""
        alloc = self.alloc
        copied_before = alloc.copied_blocks
        for g in self.running:
            if g.request.beam_width > 1:
                self.choose_beams(g, self.rng.random(len(g.seqs)).tolist())
        queue, kept = deque(self.running), []
        while queue:
            g = queue.popleft()
            while not alloc.can_append(g.seqs):
                victim = queue.pop() if queue else g  # the latest-arrived running group
                self.preempt(victim, step)
                if victim is g:
                    break
            else:
                alloc.append(g.seqs)
                kept.append(g)
        self.running = kept
        if self.swapped and not step.preempted:
            self.swap_in(step)
        step.decode = list(self.running)
        step.decode_seqs, step.decode_context = alloc.resident()
        step.cow_copies = alloc.copied_blocks - copied_before

    def choose_beams(self, g: Group, uniforms: list[float]) -> None:
        """Beam search: each next beam picks a parent among the current ones (best first);
        a beam nobody picked dies, one picked m times forks m - 1 times into dead beams' places."""
        counts = beam_parent_counts(self.rules.beam_concentration, uniforms)
        dead = [s for s, m in zip(g.seqs, counts) if m == 0]
        if not dead:
            return
        if not self.alloc.shares_memory:  # regions stay put: a dead beam's region gets a copy
            children = [s for s, m in zip(g.seqs, counts) for _ in range(m - 1)]
            for src, dst in zip(children, dead):
                self.alloc.copy_into(src, dst)
            return
        final = g.final_len(g.seqs[0])  # all beams have the request's output length
        beams, free_places = [], iter(dead)
        for s, m in zip(g.seqs, counts):
            if m:
                beams.append(s)
            for _ in range(m - 1):
                child = next(free_places)
                self.alloc.fork_into(s, child, final)
                beams.append(child)
        g.seqs = beams

    def swap_in(self, step: Step) -> None:
        """Rule 3: swapped-out groups come back oldest first while ``max_num_seqs`` allows and
        the blocks they bring plus a slot per sequence leave the watermark free; they decode
        in this same step. A group that could never fit again is aborted."""
        alloc, rules = self.alloc, self.rules
        seqs = sum(len(g.seqs) for g in self.running)
        while self.swapped:
            g = self.swapped[0]
            if seqs + len(g.seqs) > rules.max_num_seqs:
                return
            room = rules.watermark_slots + len(g.seqs) * alloc.block_size  # and a slot per sequence
            verdict = alloc.can_swap_in(g.seqs, room)
            if verdict == NEVER:
                self.swapped.pop(0)
                self.free_all(g)
                self.end(g, "aborted", "swapped-out group can no longer fit in GPU memory")
                continue
            if verdict != OK:
                return
            self.swapped.pop(0)
            blocks, slots = alloc.swap_in(g.seqs)
            g.swapped_in_blocks += blocks
            step.swap_in_blocks += blocks
            step.swap_in_slots += slots
            assert alloc.can_append(g.seqs), "swap-in left no room for the next token"
            alloc.append(g.seqs)
            seqs += len(g.seqs)
            self.start_running(g)

    def preempt(self, g: Group, step: Step) -> None:
        """Take a running group (all its sequences) off the GPU. Several sequences are
        swapped (samples and beams cannot be recomputed from the prompt alone); a single one
        is recomputed (``recompute``, ``auto``) or swapped (``swap``). With the CPU pool full:
        recompute, or abort (``abort``, and always for several sequences). A recomputed group
        rejoins the front of the waiting queue, its generated tokens folded into its prompt."""
        g.status = "preempted"
        g.preemptions += 1
        if len(g.seqs) > 1:
            mode = "swap"
        else:
            mode = "recompute" if self.rules.preemption == "auto" else self.rules.preemption
        if mode == "swap":
            if self.alloc.can_swap_out(g.seqs):
                blocks, slots = self.alloc.swap_out(g.seqs)
                g.swapped_out_blocks += blocks
                step.swap_out_blocks += blocks
                step.swap_out_slots += slots
                step.preempted_swap += 1
                g.status = "swapped"
                bisect.insort(self.swapped, g, key=lambda x: x.key)
                return
            if self.rules.swap_fallback == "abort" or len(g.seqs) > 1:
                self.free_all(g)
                self.end(g, "aborted", "CPU swap space exhausted")
                step.aborted += 1
                return
        for s in g.seqs:
            g.recomputed_tokens += self.alloc.kv_len(s)
            self.alloc.free(s)
        g.prompt_len = g.request.prompt_tokens + g.generated
        g.recomputing = True
        g.status = "waiting"
        self.waiting.appendleft(g)
        step.preempted_recompute += 1

    def start_running(self, g: Group) -> None:
        g.status = "running"
        if g.scheduled_s is None:
            g.scheduled_s = self.now
        bisect.insort(self.running, g, key=lambda x: x.key)

    # --- after the step -------------------------------------------------------------------------
    def complete(self, step: Step, now: float) -> None:
        """Every sequence of the batch gained a token; finished sequences free their memory."""
        if self.computed:  # cache tiers: the prompt blocks the prefills computed
            self.tiers.write_through(self.computed)
            self.computed = []
        for g in step.prefill + step.decode:
            if g.first_token_s is None:
                g.first_token_s = now
            else:
                self.itl.append((now - g.last_token_s, len(g.seqs)))
            g.last_token_s = now
            g.generated += 1
        for g in list(self.running):
            done = [s for s in g.seqs if g.targets[s] <= g.generated]
            for s in done:
                self.alloc.free(s)
                g.seqs.remove(s)
            if not g.seqs:
                self.running.remove(g)
                g.finish_s = now
                self.end(g, "finished", None)

    def free_all(self, g: Group) -> None:
        for s in g.seqs:
            self.alloc.free(s)

    def end(self, g: Group, status: str, reason: str | None) -> None:
        g.status, g.reason = status, reason
        if g.finish_s is None:
            g.finish_s = self.now
        self.on_end(g, self.index)


# --- vLLM v1's scheduler ---------------------------------------------------------------------
@dataclass(eq=False)
class V1Request(Group):
    """A request under vllm-v1: one sequence whose computed tokens catch up with its tokens."""

    num_tokens: int = 0  # prompt + tokens generated so far (a recomputation keeps them)
    num_computed: int = 0  # tokens whose KV is computed: 0 on arrival and after a preemption
    catch_up_to: int = 0  # num_tokens at its last admission: below it, it is prefilling
    keys: list[int] = field(default_factory=list)  # cache keys of its full blocks, by position

    @property
    def seq(self) -> int:
        return self.seqs[0]

    @property
    def target(self) -> int:
        return self.targets[self.seq]


class ReferenceV1Replica(ReferenceReplica):
    """One replica under vLLM v1's rules (``scheduler.policy: vllm-v1``).

    There are no prefill and decode phases: each request's computed tokens catch up with its
    tokens under a per-step token budget. One step (``schedule``):

    1. Running requests, in the order they were admitted, each get
       ``min(tokens left, long_prefill_token_threshold if > 0, budget left)`` tokens. A request
       that cannot get its blocks preempts the most recently admitted running request
       (recompute: its blocks are freed, it goes to the front of the waiting queue), again
       and again, until it fits or it was the victim itself.
    2. If nobody was preempted: waiting requests first come first served, while budget is
       left and fewer than ``max_num_seqs`` run. A request skips its cached prefix (at most
       ``num_tokens - 1`` tokens), its chunk is capped like a running one's; admission stops
       at the first request that would be one partial prefill too many, that cannot reserve
       blocks for its whole sequence (``reserve_full_isl``), or cannot get blocks for its chunk.

    After the step (``complete``) every chunk is computed; a request whose computed tokens
    reach its tokens samples one (its first: TTFT), and finishes when it has its output.
    Full blocks join the prefix cache when a prefill chunk fills them, or, filled by decode
    steps, when their request frees them (``cache_full_blocks``).

    Not modelled: async scheduling and CUDA graphs (each shifts work by at most one step per
    event), the null block (pass one block fewer), speculative decoding.
    """

    def add(self, request: Request, now: float) -> None:
        """A request arrives: it waits, or is rejected now if it can never run."""
        self.now = now
        seq = self.next_seq
        self.next_seq += 1
        B = self.alloc.block_size
        g = V1Request(
            request,
            [seq],
            {seq: request.output_tokens},
            request.prompt_tokens,
            sequence_block_names(request, B) if self.alloc.prefix_caching else [],
            num_tokens=request.prompt_tokens,
        )
        longest = request.prompt_tokens + request.output_tokens
        if request.num_seqs > 1:
            self.end(
                g,
                "rejected",
                "vllm-v1 runs one sequence per request (it fans samples out into separate "
                "requests and has no beam search)",
            )
        elif longest > self.rules.max_seq_len:
            self.end(
                g,
                "rejected",
                f"prompt + output = {longest} tokens exceeds the context window "
                f"(model.context_len_tokens) {self.rules.max_seq_len}",
            )
        elif blocks_for(g.final_len(seq), B) > self.alloc.num_blocks:
            # At its last step it holds prompt + output - 1 tokens (the last one is never stored).
            self.end(
                g, "rejected", f"needs more KV slots than the whole cache ({self.alloc.capacity})"
            )
        else:
            self.waiting.append(g)

    def chunk(self, tokens_left: int, budget: int) -> int:
        """Tokens a request computes this step: what it lacks, capped by the long-prefill
        threshold and by the budget left."""
        threshold = self.rules.long_prefill_token_threshold
        if threshold > 0:
            tokens_left = min(tokens_left, threshold)
        return min(tokens_left, budget)

    # --- one iteration ------------------------------------------------------------------------
    def schedule(self, now: float) -> Step:
        self.now = now
        step = Step()
        budget = self.rules.max_num_batched_tokens
        self.blocked = None
        # 1. Running requests first, in admission order.
        i = 0
        while i < len(self.running) and budget > 0:
            g = self.running[i]
            n = self.chunk(g.num_tokens - g.num_computed, budget)
            if not self.grow_or_preempt(g, n, step):
                break  # it preempted itself: nothing after it runs either
            self.add_chunk(g, n, step)
            budget -= n
            i += 1
        # 2. Waiting requests, FCFS, only if nobody was preempted.
        if not step.preempted:
            while self.waiting and budget > 0 and len(self.running) < self.rules.max_num_seqs:
                scheduled = self.admit_head(budget, step)
                if scheduled is None:
                    break
                budget -= scheduled
        # 3. Cache tiers: this scheduling's stores go out after the loads it started.
        self.send_stores()
        return step

    def grow_or_preempt(self, g: V1Request, n: int, step: Step) -> bool:
        """Give running ``g`` the blocks for ``n`` more tokens, preempting the most recently
        admitted running request while they are short. False if ``g`` itself was preempted."""
        while not self.alloc.grow(g.seq, g.num_computed + n):
            victim = self.running.pop()
            self.preempt(victim, step)
            if victim is g:
                return False
        return True

    def admit_head(self, budget: int, step: Step) -> int | None:
        """Try to admit the head of the waiting queue with a chunk of at most ``budget``
        tokens; return the chunk's tokens (0: it started a load from a cache tier instead),
        None (admission stops) if a rule holds it back."""
        alloc, rules, B = self.alloc, self.rules, self.alloc.block_size
        g: V1Request = self.waiting[0]
        looked_up = (g.num_tokens - 1) // B if alloc.prefix_caching else 0  # a hit < num_tokens
        keys = self.block_keys(g, looked_up)
        hits = alloc.cached_blocks(keys)
        if self.tiers is not None:
            found = self.tiers.lookup(keys[len(hits):])
            if found:
                return self.start_load(g, hits, found, looked_up)
        hit = len(hits) * B
        n = self.chunk(g.num_tokens - hit, budget)
        limit = rules.max_num_partial_prefills
        if limit is not None and hit + n < g.num_tokens and self.partial_prefills(step) >= limit:
            self.blocked = "partial prefills"
            return None
        if (
            rules.reserve_full_isl
            and alloc.free_blocks_needed(hits, g.num_tokens) > alloc.num_free()
        ):
            self.blocked = "no space for the whole sequence"
            return None
        if alloc.free_blocks_needed(hits, hit + n) > alloc.num_free():
            self.blocked = "no space"
            return None
        self.waiting.popleft()
        counted, g.after_load = not g.after_load, False  # back from a load: counted then
        if counted and self.tiers is not None:
            self.tier_gpu_hits(g.keys[:len(hits)], g.request.priority)
        alloc.open(g.seq, hits, hit + n, g.final_len(g.seq), looked_up if counted else 0,
                   g.request.priority, count_hits=counted)
        g.num_computed = hit
        g.catch_up_to = g.num_tokens
        g.cached_tokens = hit
        step.cached_tokens += hit
        g.status = "running"
        if g.scheduled_s is None:
            g.scheduled_s = self.now
        self.running.append(g)
        self.add_chunk(g, n, step)
        return n

    # --- loads from cache tiers (allocator.tiers) ------------------------------------------------
    def start_load(self, g: V1Request, hits: list[int], found: list[int], looked_up: int) -> int | None:
        """The head of the waiting queue finds ``len(found)`` blocks after its GPU hit in the
        cache tiers (``found``: the tier providing each): it loads them instead of being
        admitted, if the GPU has blocks for them (and for its hits nobody holds; else None:
        admission stops). It holds its hits (a GPU hit, counted now) and fresh blocks for the
        load, and waits outside both queues; returns 0 (no token budget used)."""
        alloc, B = self.alloc, self.alloc.block_size
        h, k = len(hits), len(found)
        if alloc.free_blocks_needed(hits, (h + k) * B) > alloc.num_free():
            self.blocked = "no space"
            return None
        self.waiting.popleft()
        g.after_load = False
        self.tier_gpu_hits(g.keys[:h], g.request.priority)
        alloc.open(g.seq, hits, (h + k) * B, (h + k) * B, looked_up, g.request.priority)
        g.status = "loading"
        self.loading.append(g)
        keys, start = g.keys[h : h + k], self.now
        self.tiers.start_load(
            keys, found, g.request.priority, lambda done_s: self.finish_load(g, k, start, done_s)
        )
        return 0

    def finish_load(self, g: V1Request, k: int, start_s: float, done_s: float) -> None:
        """The last transfer of ``g``'s load ended at ``done_s``: its ``k`` loaded blocks are
        cached under their keys (a key cached meanwhile keeps its own block), it releases all
        its blocks last to first (they wait in the free queue, cached) and goes back to the
        front of the waiting queue, where its next admission finds them as a GPU hit."""
        alloc = self.alloc
        alloc.register_full_blocks(g.seq, len(alloc.tables[g.seq]) * alloc.block_size, g.keys)
        alloc.free(g.seq)
        self.back_from_load(g, k, start_s, done_s)

    def partial_prefills(self, step: Step) -> int:
        """Running requests that this step leaves mid-prefill (scheduled or not)."""
        scheduled = {id(g): n for g, n in step.chunks}
        return sum(
            1 for g in self.running if g.num_computed + scheduled.get(id(g), 0) < g.num_tokens
        )

    def block_keys(self, g: V1Request, count: int) -> list[int]:
        """Cache keys of ``g``'s first ``count`` full blocks: the trace's shared names first,
        then names only ``g`` has (the rest of its prompt, its output), chained."""
        while len(g.keys) < count:
            j = len(g.keys)
            name = g.prefix[j] if j < len(g.prefix) else ("own", g.request.request_id, j)
            g.keys.append(self.alloc.chain_key(g.keys[-1] if g.keys else -1, name))
        return g.keys[:count]

    def add_chunk(self, g: V1Request, n: int, step: Step) -> None:
        """``g`` computes ``n`` tokens this step: a prefill part while it catches up with the
        tokens it had when admitted, else a decode part (its last sampled token)."""
        step.chunks.append((g, n))
        if g.num_computed < g.catch_up_to:
            if g.recomputing:  # catching up after a preemption: this chunk is work done again
                step.recompute_tokens += n
            step.prefill.append(g)
            step.prefill_tokens += n
            # Causal attention: new token i attends to the computed tokens and i new ones.
            step.prefill_pairs += n * g.num_computed + n * (n + 1) / 2
        else:
            step.decode.append(g)
            step.decode_seqs += 1
            step.decode_context += g.num_computed + n  # its KV after the step

    def preempt(self, g: V1Request, step: Step) -> None:
        """Recompute ``g`` (already taken out of ``running``): free its blocks (its cached
        ones stay findable until evicted) and put it at the front of the waiting queue."""
        g.preemptions += 1
        g.recomputed_tokens += g.num_computed
        self.cache_full_blocks(g, g.num_computed)
        self.alloc.free(g.seq)
        g.num_computed = 0
        g.recomputing = True
        g.status = "waiting"
        self.waiting.appendleft(g)
        step.preempted_recompute += 1

    # --- after the step -------------------------------------------------------------------------
    def complete(self, step: Step, now: float) -> None:
        """Every chunk is computed; a request caught up with its tokens samples one."""
        filled: list[tuple[int, int | None, int]] = []  # prompt blocks the chunks named (tiers)
        for g, n in step.chunks:  # every prefill chunk's blocks, before anyone frees
            g.num_computed += n
            named = self.alloc.offered[g.seq] if self.tiers is not None else 0
            self.cache_full_blocks(g, min(g.num_computed, g.catch_up_to))
            if self.tiers is not None:
                alloc = self.alloc
                filled += [(x, alloc.parents[x], g.request.priority)
                           for x in g.keys[named : alloc.offered[g.seq]]]
        if filled:
            self.tiers.write_through(filled)
        for g, _ in step.chunks:
            if g.num_computed < g.num_tokens:
                continue  # mid-prefill: nothing sampled
            g.recomputing = False  # caught up
            if g.first_token_s is None:
                g.first_token_s = now
            else:
                self.itl.append((now - g.last_token_s, 1))
            g.last_token_s = now
            g.num_tokens += 1
            g.generated += 1
            if g.generated == g.target:
                self.running.remove(g)
                self.cache_full_blocks(g, g.num_computed)
                self.alloc.free(g.seq)
                g.finish_s = now
                self.end(g, "finished", None)

    def cache_full_blocks(self, g: V1Request, computed: int) -> None:
        """Prefix caching: offer the blocks that ``g``'s first ``computed`` tokens fill to the
        cache. A prefill chunk's blocks are offered when it completes; the blocks decode steps
        fill, when the request frees them (finish or preemption). vLLM caches those as they
        fill; the two differ only when another request looks up a generated block while its
        request still decodes, which needs that request's answer in the other's prompt
        (``output_token_ids``): a later turn that arrives before the earlier has finished.
        A step's prefill chunks are offered before its finished requests free their blocks
        (when both hold a block of the same content, the chunk's copy is the cached one)."""
        if self.alloc.prefix_caching:
            keys = self.block_keys(g, computed // self.alloc.block_size)
            self.alloc.register_full_blocks(g.seq, computed, keys)


# --- cache tiers below the GPU (allocator.tiers) --------------------------------------------------
TIER_COUNTERS = ("hit_blocks", "loaded_tokens", "load_bytes", "store_bytes", "link_busy_s",
                 "stored_blocks", "dropped_blocks", "evictions")

Entry = tuple[int, "int | None", int]  # a key on its way into a tier: (key, parent, priority)


def tier_capacity_blocks(capacity_gib: float, block_bytes: float) -> int:
    """Blocks a tier of ``capacity_gib`` GiB (2^30 bytes) holds."""
    return math.floor(capacity_gib * 2**30 / block_bytes)


class ReferenceTiers:
    """One replica's cache tiers below its GPU pool, top first (tierspec), kept plainly.

    Each tier's contents are a ``policies.reference.tier.PlainTier``; its link is a
    ``simpy.Resource`` of capacity 1 (one transfer at a time, in the order submitted), and
    every transfer is its own SimPy process holding it::

        with link.request() as turn:   yield turn   # wait for the link
                                       yield env.timeout(latency + blocks * block_bytes / bandwidth)
        then: the stored entries are ready / the load's last transfer hands the request back

    Stores (``write_policy``; tier 0 below the GPU, tier i below tier i - 1) are collected
    into batches, one transfer per tier per batch: the scheduling's batch (``gpu_evicted``:
    write-back; ``gpu_hits`` and loads: write-through-after-hits), sent when the scheduling
    ends, after its loads; and the step's batch (``write_through``: the prompt blocks its
    chunks named), sent at its end. A batch is stored into tier i, and what tier i stored
    (write-through) or evicted (write-back) is tier i + 1's batch in the same flush.
    """

    def __init__(self, env: simpy.Environment, configs: list, block_size: int, block_bytes: float):
        self.env = env
        self.configs = list(configs)  # simulator.config.TierConfig, top first
        self.block_size, self.block_bytes = block_size, block_bytes
        self.tiers = [
            PlainTier(c.name, tier_capacity_blocks(c.capacity_gib, block_bytes), c.eviction_policy)
            for c in configs
        ]
        self.links = [simpy.Resource(env, capacity=1) for _ in configs]
        self.load_bytes = [0.0] * len(configs)
        self.store_bytes = [0.0] * len(configs)
        self.busy_s = [0.0] * len(configs)
        self.queued = [0] * len(configs)  # transfers that waited for their link (contention)
        # after-hits counts: tier 0 counts GPU hits of a key, tier i > 0 loads of it from tier i - 1
        self.counts: list[dict[int, int]] = [{} for _ in configs]
        self.pending: list[list[Entry]] = [[] for _ in configs]  # the scheduling's batch, per tier

    # --- the links ------------------------------------------------------------------------------
    def transfer(self, i: int, blocks: int, then: Callable[[float], None]) -> None:
        """Send ``blocks`` blocks over tier ``i``'s link now; ``then(end s)`` when it ends."""
        c = self.configs[i]
        duration = c.link_latency + blocks * self.block_bytes / c.link_bandwidth
        self.busy_s[i] += duration
        self.env.process(self.hold_link(i, duration, then))

    def hold_link(self, i: int, duration: float, then: Callable[[float], None]):
        """One transfer's process: wait for tier ``i``'s link, hold it ``duration`` s."""
        submitted = self.env.now
        with self.links[i].request() as turn:
            yield turn
            self.queued[i] += self.env.now > submitted
            yield self.env.timeout(duration)
        then(self.env.now)

    # --- loads ------------------------------------------------------------------------------------
    def lookup(self, keys: list[int]) -> list[int]:
        """The tier (top first) holding each of ``keys`` ready now, from the first key up to
        the first that no tier has."""
        found = []
        for key in keys:
            tiers = [i for i, tier in enumerate(self.tiers) if tier.ready(key, self.env.now)]
            if not tiers:
                break
            found.append(tiers[0])
        return found

    def start_load(self, keys: list[int], found: list[int], priority: int,
                   done: Callable[[float], None]) -> None:
        """Load ``keys`` (``found[j]``: the tier providing ``keys[j]``) for a request of
        ``priority``: one transfer per tier involved; ``done(end s)`` when the last ends.
        Each use counts toward the next tier's write-through-after-hits."""
        left = {i for i in found}

        def ended(i: int, end_s: float) -> None:
            left.discard(i)
            if not left:
                done(end_s)

        for i, tier in enumerate(self.tiers):
            mine = [key for key, t in zip(keys, found) if t == i]
            if not mine:
                continue
            tier.use(mine, priority)
            self.load_bytes[i] += len(mine) * self.block_bytes
            self.transfer(i, len(mine), lambda end_s, i=i: ended(i, end_s))
            if i + 1 < len(self.tiers):
                self.count_hits(i + 1, [(key, tier.entries[key].parent, priority) for key in mine])

    # --- stores -----------------------------------------------------------------------------------
    def gpu_hits(self, entries: list[Entry]) -> None:
        """An admission (or a load) hit these cached GPU blocks."""
        self.count_hits(0, entries)

    def gpu_evicted(self, entries: list[Entry]) -> None:
        """The GPU evicted these cached blocks during this scheduling."""
        if self.configs[0].write_policy == "write-back":
            self.pending[0] += entries

    def count_hits(self, i: int, entries: list[Entry]) -> None:
        """One more hit of each key toward tier ``i``'s write-through-after-hits: the one that
        brings a key's count to N joins tier ``i``'s scheduling batch."""
        c = self.configs[i]
        if c.write_policy != "write-through-after-hits":
            return
        for entry in entries:
            key = entry[0]
            self.counts[i][key] = self.counts[i].get(key, 0) + 1
            if self.counts[i][key] == c.write_after_hits:
                self.pending[i].append(entry)

    def flush_scheduling(self) -> None:
        """The scheduling ended: send its batch."""
        batches, self.pending = self.pending, [[] for _ in self.configs]
        self.flush(batches)

    def write_through(self, entries: list[Entry]) -> None:
        """A step ended: its chunks named these prompt blocks (in step order)."""
        if self.configs[0].write_policy == "write-through":
            self.flush([list(entries)] + [[] for _ in self.configs[1:]])

    def flush(self, batches: list[list[Entry]]) -> None:
        """Store each tier's batch, top first; tier i's stores (write-through) or evictions
        (write-back) join tier i + 1's batch."""
        for i, batch in enumerate(batches):
            if not batch:
                continue
            stored, evicted = self.store(i, batch)
            if i + 1 < len(batches):
                below = self.configs[i + 1].write_policy
                if below == "write-through":
                    batches[i + 1] += [e for e in batch if e[0] in stored]
                elif below == "write-back":
                    batches[i + 1] += evicted

    def store(self, i: int, batch: list[Entry]) -> tuple[list[int], list[Entry]]:
        """One transfer into tier ``i`` of the batch's keys it does not hold; they take room
        now and are ready when the transfer ends."""
        tier = self.tiers[i]
        keys, parents, priorities = zip(*batch)
        stored, evicted = tier.store(keys, parents, math.inf, priorities)
        if stored:
            # (a key the batch's later keys evicted again is gone already)
            entries: list[TierEntry] = [tier.entries[key] for key in stored if key in tier]
            self.store_bytes[i] += len(stored) * self.block_bytes

            def ready(end_s: float) -> None:
                for e in entries:  # (one evicted meanwhile is no longer the tier's)
                    e.ready_s = end_s

            self.transfer(i, len(stored), ready)
        return stored, evicted

    def stats(self) -> dict[str, dict[str, float]]:
        """Per tier name, the counters of ``TIER_COUNTERS``."""
        return {
            tier.name: {
                "hit_blocks": tier.hit_blocks,
                "loaded_tokens": tier.hit_blocks * self.block_size,
                "load_bytes": self.load_bytes[i],
                "store_bytes": self.store_bytes[i],
                "link_busy_s": self.busy_s[i],
                "stored_blocks": tier.stored_blocks,
                "dropped_blocks": tier.dropped_blocks,
                "evictions": tier.evictions,
            }
            for i, tier in enumerate(self.tiers)
        }
