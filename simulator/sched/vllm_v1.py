"""Iteration-level scheduling with vLLM v1's rules (``scheduler.policy: vllm-v1``).

There are no prefill and decode phases: every request has ``num_computed`` tokens of KV
catching up with its ``num_tokens`` (prompt + generated), and each call to
:meth:`SchedulerV1.schedule` forms one step under a token budget
(``max_num_batched_tokens``), after vLLM 0.19's ``vllm/v1/core/sched/scheduler.py``:

1. Running requests first, in the order they were admitted: each gets
   ``min(num_tokens - num_computed, long_prefill_token_threshold if > 0, budget left)``
   tokens, and blocks for them. When the free queue is short, the *most recently
   admitted* running request is preempted by recomputation (its blocks freed, its
   ``num_computed`` back to 0, to the *front* of the waiting queue), again and again,
   until the allocation fits or the request itself was the one preempted.
2. Then, if nothing was preempted this step, waiting requests FCFS while the budget and
   ``max_num_seqs`` allow: the prefix cache's hit is skipped (at most ``num_tokens - 1``
   tokens), the rest is chunked into the budget (at most ``max_num_partial_prefills``
   requests left mid-prefill, when set), and a request whose blocks do not fit stops
   admission (no skipping). With ``reserve_full_isl`` (vLLM's
   ``scheduler_reserve_full_isl``) it must find free blocks for its whole current
   sequence, not only for this step's chunk.
3. A step samples a token for every request whose ``num_computed`` reaches its
   ``num_tokens``; a chunk that leaves it short samples nothing. One step may mix prefill
   chunks and decodes: its :class:`BatchShape` carries both parts exactly.

Not modelled: async scheduling and CUDA graphs (they shift work by at most one step per
event), the null block (``kvsim validate`` passes one block fewer), multi-sequence
requests (vLLM v1 fans ``n`` samples out into separate requests and has no beam search:
such requests are rejected), swapping and the watermark (v1 has neither).

Speed (DESIGN.md "Performance principle"): a request that is decoding gains one token per
step, so, as in the v0 scheduler, decoders read their generated count off a shared clock
(:class:`DecodeClock`, one tick per step) and a heap orders their finishes; only requests
catching up (mid-prefill) are touched every step. When a step's blocks all fit, every
decoder's slot is taken through the allocator's lockstep path (no per-request work), and
runs of decode-only steps are advanced in closed form by the engine while nothing can
change: nobody mid-prefill, no finish, no preemption, and the head of the waiting queue
certain to stay blocked.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass, field

from kvsim.policies.kv_allocator import Admission, RunWeights
from kvsim.policies.ledger.paged_allocator import PagedAllocator, blocks_for
from kvsim.policies.ledger.v1_prefix_cache import (
    V1PrefixCacheAllocator,
    block_identities,
    identity_before,
)
from kvsim.policies.tiers.tier_stack import TierStack
from kvsim.simulator.decoding import prefix_contents
from kvsim.simulator.sched.one_sequence import OneSequenceScheduler, add_prefill_chunk
from kvsim.simulator.sched.scheduler import FinishQueue, SchedulerSettings, Step, beyond_context
from kvsim.simulator.sched.sequence import SequenceGroup, Status
from kvsim.simulator.sched.tier_connector import TierConnector
from kvsim.traces import Request


@dataclass(slots=True)
class StepV1(Step):
    """A v1 step: ``prefill`` holds the requests computing a prompt chunk (tokens in
    ``chunks``, same order), ``decode`` those decoding their last sampled token."""

    chunks: list[int] = field(default_factory=list)


class SchedulerV1(OneSequenceScheduler):
    """Owns the waiting and running queues of one replica under vLLM v1's rules.

    Per request: ``prompt_len`` is its prefill target (``num_tokens`` when it was last
    admitted), ``_prefilling[g]`` its ``num_computed`` while it catches up; once caught
    up it decodes, with ``num_computed == num_tokens - 1``.
    """

    NAME = "vllm-v1"
    SAMPLES = "vLLM v1 fans samples out into separate requests and has no beam search"

    def __init__(self, allocator: PagedAllocator, limits: SchedulerSettings,
                 on_terminal: Callable[[SequenceGroup], None], tiers: TierStack | None = None):
        if not isinstance(allocator, PagedAllocator):
            raise ValueError("scheduler policy vllm-v1 needs the paged allocator (allocator.kind: paged)")
        if allocator.prefix_caching and not isinstance(allocator, V1PrefixCacheAllocator):
            raise ValueError("scheduler policy vllm-v1 needs vLLM v1's prefix cache (V1PrefixCacheAllocator)")
        super().__init__(allocator, limits, on_terminal, tiers)
        self.cache = allocator if isinstance(allocator, V1PrefixCacheAllocator) else None
        self.waiting: deque[SequenceGroup] = deque()
        # running: in admission order, the last is preempted first; the clock counts steps:
        # a decoder's generated count is gen_base + ticks
        self._finishes = FinishQueue(by_admission=True)  # decoders by the tick of their last token
        self._admissions = 0  # requests admitted so far: the next one's ``admitted`` rank
        self._prefilling: dict[SequenceGroup, int] = {}  # running and catching up -> num_computed
        self._last_step_end = 0.0  # when the last step ended (s): every running decoder sampled then
        # a load's facts in ``loading``: the keys it loads and the first one's parent
        # Write-back sends each step's GPU evictions as one batch when it is scheduled, so
        # decode steps (which may evict) are not run together in closed form.
        self._writes_back = self.connector is not None and self.connector.stores_gpu_evictions
        if tiers is not None and self.cache is None:
            raise ValueError("cache tiers need the v1 prefix cache (allocator.prefix_caching: true)")
        if self._writes_back:
            self.cache.on_evict = tiers.gpu_evicted

    # --- arrivals --------------------------------------------------------------------
    def add(self, request: Request, now: float) -> SequenceGroup:
        """Queue a request, or reject one that could never run (as v0 does, but at once)."""
        g, why = self._arrive(request, now)
        s, out, P = g.seq_ids[0], request.output_tokens, request.prompt_tokens
        limit, B = self.limits.max_seq_len, self.alloc.block_size
        if why or (why := beyond_context(P, out, limit)):
            self._end(g, Status.REJECTED, why)
        elif blocks_for(max(g.final_len(s), P), B) * B > self.alloc.capacity:
            self._end(g, Status.REJECTED, f"needs more KV slots than the whole cache ({self.alloc.capacity})")
        else:
            if self.cache is not None:  # the chained identities of its shared prompt blocks
                g.prefix = self.cache.prefix_keys(prefix_contents(request, B, with_output=True))
            self.waiting.append(g)
        return g

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running or self.loading)

    # --- one step ------------------------------------------------------------------
    def schedule(self, now: float) -> StepV1:
        self.now = now
        step = StepV1()
        budget = self.limits.max_num_batched_tokens
        left = self._schedule_in_lockstep(step, budget) if self.running else None
        budget = left if left is not None else self._schedule_running(step, budget)
        if step.preempted:
            self.blocked = "preempted" if self.waiting else None
        else:
            self._admit(step, budget)
        if self.connector is not None:
            self.connector.scheduled(now)
        return step

    def _schedule_in_lockstep(self, step: StepV1, budget: int) -> int | None:
        """The running requests' step when all their blocks surely fit (the usual case):
        every decoder appends one slot through the allocator's lockstep path and each
        request mid-prefill its chunk, in one all-or-nothing call. Then nobody is
        preempted, and taking the same blocks at once rather than request by request
        changes only which block number goes where. Returns the budget left; None when
        memory is short (then :meth:`_schedule_running` goes request by request)."""
        running, prefilling, shape = self.running, self._prefilling, step.shape
        threshold = self.limits.long_prefill_token_threshold
        parts: list[tuple[SequenceGroup, int, int]] = []  # (request, num_computed, chunk), in running order
        extra = 0  # tokens beyond one per running request
        for pos, g in sorted((running.index(g), g) for g in prefilling) if prefilling else ():
            computed = prefilling[g]
            n = g.prompt_len - computed
            if 0 < threshold < n:
                n = threshold
            n = min(n, budget - pos - extra)  # every request before it takes one token, chunks more
            if n <= 0:
                return None
            parts.append((g, computed, n))
            extra += n - 1
        if len(running) + extra > budget or not self.alloc.extend_all(
                [(g.seq_ids[0], n) for g, _, n in parts]):
            return None
        seqs, context = self.alloc.resident_kv()
        for g, computed, n in parts:
            add_prefill_chunk(step, g, computed, n)
            seqs -= 1
            context -= computed + n
        step.decode = [g for g in running if g not in prefilling] if parts else list(running)
        shape.decode_seqs, shape.decode_context = seqs, context
        return budget - len(running) - extra

    def _schedule_running(self, step: StepV1, budget: int) -> int:
        """Running requests in admission order, each its share of the budget, request by
        request; preempt the latest admitted when blocks run out. Returns the budget left.

        The budget never runs out before the last running request: a request is admitted
        only into budget left over, and from one step to the next no request takes more
        than it took before unless it was the last one scheduled (a chunk grows only when
        the budget capped it, and then nothing after it was scheduled). So every running
        request computes at least one token in every step; decoders sample every step.
        """
        alloc, shape, running = self.alloc, step.shape, self.running
        threshold = self.limits.long_prefill_token_threshold
        i = 0
        while i < len(running) and budget > 0:
            g = running[i]
            s = g.seq_ids[0]
            computed = self._prefilling.get(g)
            n = 1 if computed is None else g.prompt_len - computed
            if 0 < threshold < n:
                n = threshold
            if n > budget:
                n = budget
            if not self._allocate(g, s, n, step):
                break  # it preempted itself: everything after it is gone too
            if computed is None:
                step.decode.append(g)
                shape.decode_seqs += 1
                shape.decode_context += alloc.kv_len(s)  # its KV after the step
            else:
                add_prefill_chunk(step, g, computed, n)
            budget -= n
            i += 1
        assert i == len(running), "a running request got no token (see the docstring)"
        return budget

    def _allocate(self, g: SequenceGroup, s: int, n: int, step: StepV1) -> bool:
        """Blocks for ``n`` more tokens of ``g``, preempting from the back of ``running``
        until they fit; False if ``g`` itself had to go."""
        while not self.alloc.extend(s, n):
            victim = self.running[-1]
            self._preempt(victim, step)
            if victim is g:
                return False
        return True

    def _admit(self, step: StepV1, budget: int) -> None:
        """Waiting requests FCFS while the budget, ``max_num_seqs`` and free blocks allow."""
        alloc, cache, lim = self.alloc, self.cache, self.limits
        B, threshold, waiting = alloc.block_size, lim.long_prefill_token_threshold, self.waiting
        self.blocked = None
        # Requests left mid-prefill by this step so far (those whose chunk completes it do not count).
        partial = len(self._prefilling) - sum(
            1 for g, n in zip(step.prefill, step.chunks) if self._prefilling[g] + n == g.prompt_len)
        while waiting:
            if budget <= 0 or len(self.running) >= lim.max_num_seqs:
                self.blocked = "limits"
                return
            g = waiting[0]
            T = g.request.prompt_tokens + g.gen_base  # num_tokens: a recomputed request keeps its tokens
            hits = cache.lookup(g.prefix, g.request.request_id, T) if cache is not None else []
            if self.connector is not None:  # the one question to the tiers: can they give more blocks?
                found = self.connector.found(g, len(hits), (T - 1) // B, self.now)
                if found:
                    if len(found) + len(hits) - (cache.in_use(hits) if hits else 0) > alloc.num_free_blocks:
                        self.blocked = Admission.NO_SPACE
                        return
                    self._start_load(waiting.popleft(), hits, found, T)
                    continue
            hit = len(hits) * B
            n = T - hit
            if 0 < threshold < n:
                n = threshold
            if n > budget:
                n = budget
            if lim.max_num_partial_prefills is not None and hit + n < T and partial >= lim.max_num_partial_prefills:
                self.blocked = "limits"
                return
            held = cache.in_use(hits) if hits else 0  # hit blocks other requests hold cost no free block
            free = alloc.num_free_blocks
            if (lim.reserve_full_isl and blocks_for(T, B) - held > free) or blocks_for(hit + n, B) - held > free:
                self.blocked = Admission.NO_SPACE
                return
            waiting.popleft()
            s = g.seq_ids[0]
            if cache is not None:
                cache.take_hits(hits, g.request.priority)
            alloc.open_seq(s, hits, hit + n, g.final_len(s))
            if cache is not None:
                lookups = (T - 1) // B
                if g.after_load:  # its lookup and hits were counted when its load started
                    g.after_load = False
                    cache.prefix_hits -= len(hits)
                    lookups = 0
                elif self.connector is not None:
                    self.connector.gpu_hits(g, len(hits), g.request.priority)
                cache.name(s, g.prefix, g.request.request_id, len(hits), lookups, g.request.priority)
            g.prompt_len = T
            g.cached_tokens = hit
            step.cached_tokens += hit
            g.gen_base -= self.clock.ticks
            g.status = Status.RUNNING
            g.due = -1  # no finish filed until it samples
            if g.first_scheduled is None:
                g.first_scheduled = self.now
            self.running.append(g)
            g.admitted = self._admissions
            self._admissions += 1
            self._prefilling[g] = hit
            add_prefill_chunk(step, g, hit, n)
            budget -= n
            if hit + n < T:
                partial += 1

    # --- loads from cache tiers (policies.tiers.tier_stack) --------------------------------
    def _start_load(self, g: SequenceGroup, hits: list[int], found: list[int], T: int) -> None:
        """``g`` loads the ``len(found)`` blocks after its GPU hit from the tiers ``found``
        names: it holds its hit blocks and fresh ones for the load, and waits for it
        outside both queues (no batch slot, no token budget)."""
        cache, B = self.cache, self.alloc.block_size
        prio, s, h = g.request.priority, g.seq_ids[0], len(hits)
        g.after_load = False
        cache.prefix_lookups += (T - 1) // B
        self.connector.gpu_hits(g, h, prio)
        cache.start_load(s, hits, len(found), prio)
        done, keys = self.connector.load(g, h, found, self.now, prio)
        self._await_load(done, s, g, keys, identity_before(g.prefix, g.request.request_id, h))

    def _block_names(self, g: SequenceGroup, start: int, stop: int) -> Iterable[Hashable]:
        """The tiers name a block by its identity in v1's prefix cache."""
        return block_identities(g.prefix, g.request.request_id, start, stop)

    def _load_done(self, s: int, g: SequenceGroup, keys: list, parent: object) -> int:
        """The loaded blocks are cached on the GPU and released."""
        self.cache.finish_load(s, keys, parent, g.request.priority)
        return len(keys) * self.alloc.block_size

    # --- preemption --------------------------------------------------------------------
    def _preempt(self, g: SequenceGroup, step: StepV1) -> None:
        """Recompute preemption of the last running request: free its blocks (their cached
        identities stay until evicted), back to the front of the waiting queue."""
        assert self.running[-1] is g
        self.running.pop()
        s = g.seq_ids[0]
        g.recomputed_tokens += self.alloc.kv_len(s)
        self.alloc.free(s)
        if self._prefilling.pop(g, None) is None:
            g.last_token = self._last_step_end  # a decoder sampled when the last step ended
        g.gen_base += self.clock.ticks
        g.status = Status.WAITING
        g.due = -1
        g.recomputing = True
        g.preemptions += 1
        self.waiting.appendleft(g)
        step.preempted_recompute += 1

    # --- runs of identical decode steps (DESIGN.md "Performance principle") --------------
    def run_length(self, step: StepV1, limit: int) -> int:
        """How many more decode-only steps identical to ``step`` are certain to follow:
        nobody mid-prefill, no preemption, no finish before the last of them, every block
        fits, and the head of the waiting queue stays blocked (memory only shrinks while
        decoding). Arrivals are the engine's business."""
        if step.prefill or not step.decode or step.preempted or self._prefilling:
            return 0
        if self._writes_back:
            return 0  # each step's GPU evictions are a batch of their own
        if self.waiting and not self._head_stays_blocked():
            return 0
        return self._lockstep_room(limit, scheduled=1)

    def continue_length(self, limit: int) -> int:
        """After a run's finishes were retired: more identical decode steps at once, only
        when nothing waits (a finish frees blocks the head might take)."""
        if self.waiting or not self.running or self._prefilling or self._writes_back:
            return 0
        return self._lockstep_room(limit, scheduled=0)

    def _head_stays_blocked(self) -> bool:
        """While every running request decodes and none finishes, is the head of the
        waiting queue certain to stay blocked at every coming step? The running count and the budget
        left stay put, free blocks only shrink, and the head's prefix hit can only get
        shorter (decodes may evict its blocks from the free queue): so judge it by the
        fewest blocks any shorter hit could need."""
        lim, running = self.limits, len(self.running)
        budget = lim.max_num_batched_tokens - running
        if running >= lim.max_num_seqs or budget <= 0:
            return True
        free = self.alloc.num_free_blocks
        if self.connector is not None and free:
            return False  # a store turning readable may start a load, which needs one free block
        g, cache, B = self.waiting[0], self.cache, self.alloc.block_size
        T = g.request.prompt_tokens + g.gen_base
        hits = cache.lookup(g.prefix, g.request.request_id, T) if cache is not None else []
        if lim.reserve_full_isl and blocks_for(T, B) - (cache.in_use(hits) if hits else 0) > free:
            return True
        cap = budget if not 0 < lim.long_prefill_token_threshold < budget else lim.long_prefill_token_threshold
        held, least = 0, blocks_for(min(T, cap), B)  # no hit left
        for h, b in enumerate(hits, 1):
            held += cache.held(b)
            least = min(least, blocks_for(min(T, h * B + cap), B) - held)
        return least > free

    def _lockstep_room(self, limit: int, scheduled: int) -> int:
        due = self._finishes.next_due()
        k = min(limit, due - self.clock.ticks - scheduled) if due is not None else limit
        return self.alloc.max_advance_all(k) if k > 0 else 0


    # --- after the step ---------------------------------------------------------------
    def complete(self, step: StepV1, now: float, *, run: RunWeights | None = None) -> None:
        """The step (then ``run``'s further decode steps, if given) ended at ``now``:
        chunks count as computed, full blocks are cached, and every request that caught
        up with its tokens sampled one."""
        end = now - run.total if run is not None else now  # when ``step`` itself ended
        self.clock.ticks += 1
        prefilling, itl = self._prefilling, self.itl
        for g in prefilling:  # catching up generates nothing: hold their count against the tick
            g.gen_base -= 1
        if step.decode:  # each sampled its last token when the previous step ended
            itl.add(end - self._last_step_end, len(step.decode))
        connector = self.connector
        for g, n in zip(step.prefill, step.chunks):
            if connector is not None:
                self._filled_blocks(g, connector)
            elif self.cache is not None:
                self.cache.register_full(g.seq_ids[0])
            computed = prefilling[g] + n
            if computed < g.prompt_len:
                prefilling[g] = computed
                continue
            del prefilling[g]
            g.recomputing = False
            g.gen_base += 1  # caught up: it sampled a token
            if g.first_token is None:
                g.first_token = end
            else:  # recomputed: the gap since its last token spans the preemption
                itl.add(end - g.last_token)
            self._finishes.file(g)
        self._last_step_end = end
        if connector is not None:
            connector.step_ended(end)
        if run is not None:
            self._run_done(run, step.shape.decode_seqs, now)
        self._retire_due(now)

    def _filled_blocks(self, g: SequenceGroup, connector: TierConnector) -> None:
        """Cache the blocks ``g``'s chunk filled, and tell the tiers (written through)."""
        s, cache = g.seq_ids[0], self.cache
        start = cache.named_blocks(s)
        cache.register_full(s)
        connector.computed(g, start, cache.named_blocks(s), g.request.priority)

    def complete_run(self, run: RunWeights, now: float) -> None:
        """A run that went on past a finish (no step of its own) ended at ``now``."""
        self._run_done(run, len(self.running), now)
        self._retire_due(now)

    def _run_done(self, run: RunWeights, seqs: int, now: float) -> None:
        self.itl.add_linear(run.first, run.slope, run.steps, seqs)
        self.clock.ticks += run.steps
        self._last_step_end = now

    def _retire_due(self, now: float) -> None:
        self._finishes.retire_due(self.clock.ticks, self._retire, now)

    def _retire(self, g: SequenceGroup, now: float) -> None:
        self.alloc.free(g.seq_ids.pop())
        g.gen_base += self.clock.ticks
        g.last_token = g.finish = now
        self.running.remove(g)
        self._end(g, Status.FINISHED, None)

