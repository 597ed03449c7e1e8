"""Scheduling with SGLang's rules (``scheduler.policy: sglang``) over its radix cache.

After SGLang's ``python/sglang/srt/managers/scheduler.py`` (``get_next_batch_to_run``,
``get_new_batch_prefill``, ``update_running_batch``), ``schedule_policy.py``
(``SchedulePolicy``, ``PrefillAdder``) and ``schedule_batch.py`` (``retract_decode``);
read to learn the rules, not copied. Each call to :meth:`SchedulerSGLang.schedule` forms
one step:

1. **A prefill batch, if one can be formed.** The waiting queue is ordered by
   ``schedule_policy``: ``lpm`` (longest cached prefix first; plain arrival order when more
   than ``LPM_FALLBACK_QUEUE`` = 128 requests wait; a request whose cached prefix is under
   ``IN_BATCH_CHECK_THRESHOLD`` = 32 tokens but which shares at least
   ``IN_BATCH_DEPRIORITIZE_THRESHOLD`` = 32 tokens with a request ahead of it in the queue is
   moved to the back, so the first computes the prefix and the second hits it next time),
   ``dfs-weight`` (depth-first over the tree, heavier subtrees first, a node's own requests
   after its subtrees: a subtree's weight is the number of waiting requests whose cached
   prefix ends in it) or ``fcfs``. Then, as
   SGLang's ``PrefillAdder``: the request being chunked continues first; waiting requests
   follow while ``max_num_seqs`` allows and each fits the memory left after *reserving*
   ``new_token_ratio`` x (remaining output, clipped at ``CLIP_MAX_NEW_TOKENS`` = 4096) for
   every running request and the whole (clipped) output for every request admitted this
   step: ``prompt - cached + clipped output < free + evictable - reservations`` (judged
   after its cached prefix is locked: locked tokens are not evictable). A request that
   does not fit stops admission (no skipping). Prompt tokens per step are capped at
   ``max_prefill_tokens`` (``max_num_batched_tokens``; a request reaching it stops admission
   unless it is the first) and
   chunked at ``chunked_prefill_size``: the request that crosses it runs a chunk and
   continues next step (one request mid-prefill at a time).
2. A step with a prefill batch is **prefill only** (the running requests wait), unless
   ``enable_mixed_chunk``: then the running requests decode in the same step (SGLang's
   ``mix_with_running``; their token is reserved in the admission check).
3. Otherwise a **decode step**: every running request appends one token. If the free and
   evictable slots cannot hold them, requests are **retracted** (back to the queue, their
   own KV freed, recomputed later): the one with the fewest generated tokens first, ties
   the longest prompt, until ``RETRACT_DECODE_STEPS`` = 20 tokens per remaining request fit
   (or one is left); ``new_token_ratio`` becomes min(1, (tokens generated + 20 x remaining)
   / (their output tokens + 1)). A decode step that needs no retraction decays the ratio.

The ratio's defaults are SGLang's (``python/sglang/srt/environ.py``:
``SGLANG_INIT_NEW_TOKEN_RATIO`` = 0.7, ``SGLANG_MIN_NEW_TOKEN_RATIO_FACTOR`` = 0.14,
``SGLANG_NEW_TOKEN_RATIO_DECAY_STEPS`` = 600, ``SGLANG_RETRACT_DECODE_STEPS`` = 20,
``SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION`` = 4096; ``scheduler.py`` ``init_schedule_policy``):
initial ratio 0.7 x ``schedule_conservativeness``, floor 0.14 x that, decay per decode step
(initial - floor) / 600. The LPM fallback (128) is ``schedule_policy.py``'s
``_determine_active_policy``; the in-batch thresholds (32, 32) are
``IN_BATCH_PREFIX_CACHING_CHECK_THRESHOLD`` / ``..._DEPRIORITIZE_THRESHOLD``.

The radix cache (:class:`policies.indexes.radix_cache.RadixCacheAllocator`) is told of every step:
a request locks its cached prefix when admitted (at most prompt - 1 tokens hit), its
computed tokens join the tree after every prefill chunk (``cache_unfinished_req``), and its
prompt and output join it when it finishes (``cache_finished_req``); a retracted request's
own tokens are freed without inserting them (``release_kv_cache(is_insert=False)``).

Choices where SGLang leaves kvsim a choice: a request's ``max_new_tokens`` is its true
output length (SGLang's benchmarks send exactly that with ``ignore_eos``); retracted
requests rejoin the back of the queue (``lpm`` sorts them anyway); multi-sequence requests
(``n`` > 1, beams) are rejected (SGLang runs parallel samples as separate requests).

Cache tiers (``allocator.tiers``; ``policies.tiers.tier_stack``, DESIGN.md "Cache tiers"), as
SGLang's HiCache keeps a host tier (and storage) below the radix cache, by the same rules as
under vllm-v1 where the radix cache allows; adapted:

- A tier entry is a *page* (``page_size`` tokens), named by the chained identity of its
  content (:class:`policies.indexes.radix_cache.PageChain`: (previous page's name, page tokens),
  interned), so a page is only found after the pages before it, as a block under vLLM.
- **Lookup.** Every waiting request considered for admission (in ``schedule_policy``
  order, after the ``max_num_seqs`` check) first locks its radix match (at most its tokens
  - 1, whole pages); the pages after it, below that cap, are looked up page by page in the
  tiers (the top tier holding one ready provides it) up to the first page none holds.
- **Load** (some page found): instead of being admitted the request needs slots for the
  pages among those available (free or evictable; else admission stops, NO_SPACE, as for a
  request that does not fit), counts its lookup and radix hit now, keeps its prefix
  locked, takes fresh slots for the pages (which may evict) and waits outside the queue and
  the batch (no batch slot, no prefill budget); admission goes on with the next request.
  When its last transfer ends the pages join the tree (pages cached meanwhile are
  duplicates and freed), it lets go of its slots and lock, and goes back to the *front*
  of the waiting queue (loads ending together: by end time, then sequence, each to the
  front); its next admission counts no lookup and no hit. (``lpm`` and ``dfs-weight``
  re-sort the queue every step, so the front matters under ``fcfs``, for ties, and when
  more than 128 wait.)
- **Stores**: ``write-through`` the pages a prefill chunk puts in the tree (when its step
  ends; decode tokens join the tree only when a request finishes and are not stored,
  as vLLM's connector stores prompt blocks); ``write-through-after-hits`` a page at its
  N-th radix hit at admission (or at a load's start); ``write-back`` the pages of every
  node the tree evicts, first to last, with the node's priority (tree evictions happen
  only while scheduling, so they go out in the scheduling's batch, after its loads).

Speed: no macro-steps. Each decode step touches every running request (one slot each from
the allocator), so a run costs O(steps x batch), not O(events); the prefix work itself is
per event (a match or insert per admission, chunk and finish, walking nodes). Runs of
decode steps could be advanced at once only between events that this scheduler cannot yet
predict cheaply (a decay of the ratio can unblock admission at any step), so they are not.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from itertools import islice

from kvsim.policies.indexes.radix_cache import (
    RadixCacheAllocator,
    Tokens,
    packed_tokens,
    request_tokens,
)
from kvsim.policies.kv_allocator import Admission, RunWeights
from kvsim.policies.tiers.tier_stack import TierStack
from kvsim.simulator.sched.one_sequence import OneSequenceScheduler, add_prefill_chunk
from kvsim.simulator.sched.scheduler import SchedulerSettings, Step
from kvsim.simulator.sched.sequence import SequenceGroup, Status
from kvsim.traces import Request

INIT_NEW_TOKEN_RATIO = 0.7
MIN_NEW_TOKEN_RATIO_FACTOR = 0.14
NEW_TOKEN_RATIO_DECAY_STEPS = 600
RETRACT_DECODE_STEPS = 20
CLIP_MAX_NEW_TOKENS = 4096
LPM_FALLBACK_QUEUE = 128
IN_BATCH_CHECK_THRESHOLD = 32
IN_BATCH_DEPRIORITIZE_THRESHOLD = 32
SCHEDULE_POLICIES = ("lpm", "dfs-weight", "fcfs")


@dataclass(frozen=True)
class SGLangSettings(SchedulerSettings):
    """The shared limits plus SGLang's own knobs (``scheduler.*`` keys under ``policy:
    sglang``). ``max_num_batched_tokens`` is SGLang's ``max_prefill_tokens``, ``max_num_seqs``
    its ``max_running_requests``."""

    policy: str = "sglang"
    schedule_policy: str = "lpm"
    chunked_prefill_size: int | None = 8192  # tokens; None: prompts are never chunked
    enable_mixed_chunk: bool = False
    schedule_conservativeness: float = 1.0


@dataclass(slots=True)
class StepSGLang(Step):
    """``prefill`` holds the requests computing a prompt chunk (tokens in ``chunks``)."""

    chunks: list[int] = field(default_factory=list)


class SchedulerSGLang(OneSequenceScheduler):
    """Owns one replica's waiting queue, running batch and the request mid-prefill."""

    NAME = "sglang"
    SAMPLES = "SGLang runs parallel samples as separate requests"

    def __init__(self, allocator: RadixCacheAllocator, limits: SchedulerSettings,
                 on_terminal: Callable[[SequenceGroup], None], tiers: TierStack | None = None):
        if not isinstance(allocator, RadixCacheAllocator):
            raise ValueError("scheduler policy sglang needs the radix cache (RadixCacheAllocator)")
        super().__init__(allocator, limits, on_terminal, tiers)
        # plain SchedulerSettings (policy sglang): SGLang's defaults for its own knobs
        self.settings = limits if isinstance(limits, SGLangSettings) else SGLangSettings()
        if self.settings.schedule_policy not in SCHEDULE_POLICIES:
            raise ValueError(f"schedule_policy must be one of {', '.join(SCHEDULE_POLICIES)}, "
                             f"got {self.settings.schedule_policy!r}")
        init = min(INIT_NEW_TOKEN_RATIO * self.settings.schedule_conservativeness, 1.0)
        self.init_ratio = init
        self.min_ratio = min(init * MIN_NEW_TOKEN_RATIO_FACTOR, 1.0)
        self.ratio_decay = (init - self.min_ratio) / NEW_TOKEN_RATIO_DECAY_STEPS
        self.new_token_ratio = init
        self.waiting: list[SequenceGroup] = []
        # running: decoding, in the order they joined; the clock never ticks: generated counts
        # are kept per request
        self.chunked: SequenceGroup | None = None  # mid-prefill (not in ``running``)
        # a waiting or running request's tokens (prompt, then output), packed while every
        # request's can be (``packed_tokens``), as tuples from the first that cannot on
        self._tokens: dict[SequenceGroup, Tokens] = {}
        self._packed = True
        self._target: dict[SequenceGroup, int] = {}  # tokens the current prefill computes to
        # Cache tiers below the radix cache (module docstring, "Cache tiers"): a load's fact in
        # ``loading`` is the number of pages it loads
        self._page_keys: dict[SequenceGroup, list[int]] = {}  # a request's page names so far
        if self.connector is not None and self.connector.stores_gpu_evictions:
            allocator.listen_evictions(tiers.gpu_evicted)

    # --- arrivals --------------------------------------------------------------------
    def add(self, request: Request, now: float) -> SequenceGroup:
        """Queue a request, or reject one that could never run."""
        g, why = self._arrive(request, now)
        out, P = request.output_tokens, request.prompt_tokens
        limit, cap = self.limits.max_seq_len, self.alloc.capacity
        if why:
            self._end(g, Status.REJECTED, why)
        elif P + out > limit:
            self._end(g, Status.REJECTED, f"prompt + output = {P + out} tokens exceeds the context window "
                                          f"(model.context_len_tokens) {limit}")
        elif P + min(out, CLIP_MAX_NEW_TOKENS) >= cap or P + out - 1 > cap:  # (admission's test alone;
            # its whole KV, which a clipped estimate may not cover)
            self._end(g, Status.REJECTED, f"needs more KV slots than the whole cache ({cap})")
        else:
            self._tokens[g] = self._request_tokens(request, out)
            self.waiting.append(g)
        return g

    def _request_tokens(self, request: Request, out: int) -> Tokens:
        tokens = packed_tokens(request, out) if self._packed else None
        if tokens is None:
            if self._packed:  # one kind in the tree: every sequence becomes a tuple
                self._packed = False
                self.alloc.unpack()
                for g, t in self._tokens.items():
                    self._tokens[g] = tuple(t)
            tokens = request_tokens(request, out)
        return tokens

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running or self.chunked or self.loading)

    # --- queue order -----------------------------------------------------------------
    def _num_tokens(self, g: SequenceGroup) -> int:
        """Tokens its next prefill computes to: prompt, plus what it generated before a retraction."""
        return g.request.prompt_tokens + g.gen_base

    def order_queue(self) -> None:
        """Sort the waiting queue by ``schedule_policy`` (stable: ties keep queue order)."""
        policy, waiting = self.settings.schedule_policy, self.waiting
        if policy == "fcfs" or len(waiting) < 2 or (policy == "lpm" and len(waiting) > LPM_FALLBACK_QUEUE):
            return
        tree = self.alloc.tree
        matches = {}
        for g in waiting:
            T = self._num_tokens(g)
            matches[g] = tree.match(self._tokens[g], T - 1)
        if policy == "lpm":
            # SGLang matches each prompt against a radix tree of the prompts ahead of it; only
            # whether the match reaches the threshold matters, and it does exactly when the first
            # threshold tokens equal those of a prompt ahead: a set of those heads does the same.
            back, seen, D = set(), set(), IN_BATCH_DEPRIORITIZE_THRESHOLD
            for g in waiting:
                if matches[g][0] < IN_BATCH_CHECK_THRESHOLD and self._num_tokens(g) >= D:
                    head = tuple(self._tokens[g][:D])
                    if head in seen:
                        back.add(g)
                    else:
                        seen.add(head)
            waiting.sort(key=lambda g: (g in back, -matches[g][0]))
        else:
            self._sort_by_dfs_weight(matches)

    def _sort_by_dfs_weight(self, matches: dict) -> None:
        """Depth first over the tree, as SGLang's ``_get_dfs_priority``: at each node its
        children by weight, heaviest first (weight: waiting requests whose cached prefix
        ends in that subtree; ties in tree order), then the requests ending at the node
        itself (queue order). Only nodes with weight are visited."""
        root = self.alloc.tree.root
        weight: dict[int, int] = {}
        ends: dict[int, list[SequenceGroup]] = {}
        for g in self.waiting:
            node = matches[g][1]
            ends.setdefault(node.uid, []).append(g)
            m = node
            while m is not None:
                weight[m.uid] = weight.get(m.uid, 0) + 1
                m = m.parent
        order: list[SequenceGroup] = []
        stack = [(root, False)]
        while stack:
            m, expanded = stack.pop()
            if expanded:
                order.extend(ends.get(m.uid, ()))
                continue
            stack.append((m, True))
            children = sorted((c for c in m.children.values() if c.uid in weight), key=lambda c: -weight[c.uid])
            stack.extend((c, False) for c in reversed(children))
        self.waiting[:] = order

    # --- one step ------------------------------------------------------------------
    def schedule(self, now: float) -> StepSGLang:
        self.now = now
        step = StepSGLang()
        self._prefill(step)
        if step.prefill:
            alloc = self.alloc
            if self.settings.enable_mixed_chunk and self.running and sum(
                    alloc.slots_to_extend(g.seq_ids[0], 1) for g in self.running) <= alloc.available():
                self._decode(step, retract=False)  # (SGLang mixes without retraction)
        elif self.running:
            self._decode(step, retract=True)
        if self.connector is not None:  # this scheduling's write-back / after-hits stores, after its loads
            self.connector.scheduled(now)
        return step

    def _reserved(self) -> float:
        """Slots held back for the running requests' future tokens (SGLang's
        ``rem_total_token_offset`` before admission)."""
        r = self.new_token_ratio
        return sum(min(g.request.output_tokens - g.gen_base, CLIP_MAX_NEW_TOKENS) for g in self.running) * r

    def _prefill(self, step: StepSGLang) -> None:
        """The chunked request's next chunk, then waiting requests while they fit."""
        lim, alloc, P = self.limits, self.alloc, self.alloc.page_size
        mixed = self.settings.enable_mixed_chunk and bool(self.running)
        offset = self._reserved() + (len(self.running) if mixed else 0)
        rem_input = lim.max_num_batched_tokens
        chunk = self.settings.chunked_prefill_size
        rem_chunk = chunk if chunk is not None else None
        self.blocked = None
        # SGLang judges every admission of a step against the memory there was before the
        # step's allocations (they happen when the batch is built), less ``offset``, which
        # counts them; locks taken meanwhile do shrink it. ``taken``: slots allocated so far.
        taken = 0
        g = self.chunked
        if g is not None:  # it continues first
            left = self._target[g] - alloc.kv_len(g.seq_ids[0])
            n = left if rem_chunk is None or left <= rem_chunk else rem_chunk // P * P
            finishing = n == left
            taken = alloc.slots_to_extend(g.seq_ids[0], n)
            if n > 0 and alloc.extend(g.seq_ids[0], n):
                self._add_chunk(step, g, n)
                offset += n + (min(g.request.output_tokens - g.gen_base, CLIP_MAX_NEW_TOKENS) if finishing else 0)
                rem_input -= n
                if rem_chunk is not None:
                    rem_chunk -= n
                if not finishing:
                    self.blocked = "limits" if self.waiting else None
                    return
                self.chunked = None
            else:
                self.blocked = Admission.NO_SPACE if self.waiting else None
                return
        if not self.waiting:
            return
        if len(self.running) + len(step.prefill) >= lim.max_num_seqs:
            self.blocked = "limits"
            return
        self.order_queue()
        admitted = 0  # waiting requests taken out: admitted, or loading from a cache tier
        waiting = self.waiting
        for g in waiting:
            if len(self.running) + len(step.prefill) >= lim.max_num_seqs:
                self.blocked = "limits"
                break
            T = self._num_tokens(g)
            tokens = self._tokens[g]
            s = g.seq_ids[0]
            # Lock its cached prefix first: locked tokens are no longer evictable, so the
            # memory left shrinks by the part of the hit no running request held (SGLang
            # checks again under ``_lock_node`` for the same reason).
            hit = alloc.open(s, tokens, T, self._final_len(g), g.request.priority)
            if self.connector is not None and (  # the one question to the tiers: can they give more pages?
                    found := self.connector.found(g, hit // P, (T - 1) // P, self.now)):
                # the pages must fit in what admission may take: the running requests'
                # reservation (``offset``) holds for a load as for a prefill
                if len(found) * P >= alloc.available() + taken - offset:  # no room: admission stops
                    self.blocked = Admission.NO_SPACE
                    alloc.retract(s)
                    break
                self._start_load(g, hit, found, T)
                admitted += 1
                continue
            extend = T - hit
            clipped = min(g.request.output_tokens - g.gen_base, CLIP_MAX_NEW_TOKENS)
            n = extend if rem_chunk is None or extend <= rem_chunk else rem_chunk // P * P
            more = alloc.slots_to_extend(s, n)
            if extend + clipped >= alloc.available() + taken - offset:
                self.blocked = Admission.NO_SPACE
            elif (extend >= rem_input and step.prefill) or n <= 0:
                self.blocked = "limits"
            elif not alloc.extend(s, n):  # (page rounding only: the check above leaves room)
                self.blocked = Admission.NO_SPACE
            if self.blocked is not None:
                alloc.retract(s)  # let go of the lock: nothing was taken
                break
            if g.after_load:  # its lookup and hits were counted when its load started
                g.after_load = False
            else:
                alloc.count_lookup(T, hit)
                if self.connector is not None:
                    self.connector.gpu_hits(g, hit // P, g.request.priority)
            taken += more
            admitted += 1
            g.prompt_len = T
            g.cached_tokens = hit
            step.cached_tokens += hit
            g.status = Status.RUNNING
            if g.first_scheduled is None:
                g.first_scheduled = self.now
            self._target[g] = T
            self._add_chunk(step, g, n)
            if n < extend:
                self.chunked = g
                offset += n
            else:
                offset += n + clipped
            rem_input -= n
            if rem_chunk is not None:
                rem_chunk -= n
            if self.chunked is not None or alloc.available() + taken - offset <= 0 or rem_input <= 0 or (
                    rem_chunk is not None and rem_chunk <= 0):
                self.blocked = "limits" if len(waiting) > admitted else None
                break
        del waiting[:admitted]

    # --- loads from cache tiers (policies.tiers.tier_stack) --------------------------------
    def _keys(self, g: SequenceGroup, stop: int) -> list[int]:
        """The names of ``g``'s first ``stop`` pages (at least; computed once per request)."""
        keys = self._page_keys.setdefault(g, [])
        if len(keys) < stop:
            self.alloc.pages.extend(self._tokens[g], keys, stop)
        return keys

    def _block_names(self, g: SequenceGroup, start: int, stop: int) -> Iterable[int]:
        """The tiers name a page by its chained identity (pages ``start .. stop - 1``)."""
        return islice(self._keys(g, stop), start, stop)

    def _start_load(self, g: SequenceGroup, hit: int, found: list[int], T: int) -> None:
        """``g`` loads the ``len(found)`` pages after its radix hit (locked since ``open``) from
        the tiers ``found`` names into fresh slots; it waits outside the queue and the batch."""
        alloc, P, s = self.alloc, self.alloc.page_size, g.seq_ids[0]
        g.after_load = False
        alloc.count_lookup(T, hit)
        self.connector.gpu_hits(g, hit // P, g.request.priority)
        k = len(found)
        alloc.extend(s, k * P)  # (may evict: write-back stores what goes)
        done, _ = self.connector.load(g, hit // P, found, self.now, g.request.priority)
        self._await_load(done, s, g, k)

    def _load_done(self, s: int, g: SequenceGroup, k: int) -> int:
        """The ``k`` loaded pages join the tree (pages cached meanwhile are duplicates, freed)
        and the request lets go of its slots and lock (a radix hit awaits it)."""
        self.alloc.finish(s)
        return k * self.alloc.page_size

    def _final_len(self, g: SequenceGroup) -> int:
        return g.request.prompt_tokens + g.request.output_tokens - 1

    def _add_chunk(self, step: StepSGLang, g: SequenceGroup, n: int) -> None:
        """``g`` computes ``n`` more tokens this step (its KV already counts them)."""
        add_prefill_chunk(step, g, self.alloc.kv_len(g.seq_ids[0]) - n, n)

    def _decode(self, step: StepSGLang, retract: bool) -> None:
        """Every running request appends a token; retract when memory runs out."""
        alloc, running = self.alloc, self.running
        if retract:
            need = sum(alloc.slots_to_extend(g.seq_ids[0], 1) for g in running)
            if need > alloc.available():
                self._retract(step)
            else:
                self.new_token_ratio = max(self.new_token_ratio - self.ratio_decay, self.min_ratio)
        shape = step.shape
        for g in running:
            s = g.seq_ids[0]
            if not alloc.extend(s, 1):
                raise RuntimeError(f"sglang: no KV slot for request {g.request.request_id}'s next token "
                                   "(SGLang would abort it out of memory)")
            step.decode.append(g)
            shape.decode_seqs += 1
            shape.decode_context += alloc.kv_len(s)

    def _retract(self, step: StepSGLang) -> None:
        """Retract the requests with the fewest generated tokens (ties: the longest prompt)
        until 20 tokens per remaining request fit, or one is left (none, when loads from a
        cache tier hold the slot the last one needs: they give it back when they end);
        raise the ratio."""
        alloc, running = self.alloc, self.running
        order = sorted(running, key=lambda g: (g.gen_base, -g.request.prompt_tokens), reverse=True)
        while (len(order) > 1 and alloc.available() < len(order) * RETRACT_DECODE_STEPS * alloc.page_size
               or self.loading and len(order) == 1
               and alloc.slots_to_extend(order[0].seq_ids[0], 1) > alloc.available()):
            g = order.pop()
            running.remove(g)
            s = g.seq_ids[0]
            g.recomputed_tokens += alloc.kv_len(s)
            alloc.retract(s)
            g.status = Status.WAITING
            g.recomputing = True
            g.preemptions += 1
            self.waiting.append(g)
            step.preempted_recompute += 1
        total_gen = sum(g.gen_base for g in order)
        total_max = sum(g.request.output_tokens for g in order)
        self.new_token_ratio = min(1.0, (total_gen + RETRACT_DECODE_STEPS * len(order)) / (total_max + 1))

    # --- no runs of identical steps (see the module docstring) --------------------------
    def run_length(self, step: StepSGLang, limit: int) -> int:
        return 0

    def continue_length(self, limit: int) -> int:
        return 0

    # --- after the step ---------------------------------------------------------------
    def complete(self, step: StepSGLang, now: float, run: RunWeights | None = None) -> None:
        """The step ended at ``now``: chunks are computed and cached, requests that
        finished their prefill sampled a token and joined the batch, decoders sampled."""
        alloc, itl = self.alloc, self.itl
        finished = []
        connector = self.connector
        for g in step.decode:  # each sampled; its gap since its own last token (prefill steps stall it)
            itl.add(now - g.last_token)
            g.last_token = now
            g.gen_base += 1
            if g.gen_base >= g.request.output_tokens:
                finished.append(g)
        for g in step.prefill:
            s = g.seq_ids[0]
            before = alloc.cached_len(s)
            alloc.cache_unfinished(s)
            if connector is not None:  # the pages its chunk put in the tree: written through
                P = alloc.page_size
                connector.computed(g, before // P, alloc.cached_len(s) // P, g.request.priority)
            if alloc.kv_len(s) < self._target[g]:
                continue  # mid-prefill: it continues next step
            del self._target[g]
            g.recomputing = False
            g.gen_base += 1  # it sampled a token
            if g.first_token is None:
                g.first_token = now
            else:  # recomputed: the gap since its last token spans the retraction
                itl.add(now - g.last_token)
            g.last_token = now
            self.running.append(g)
            if g.gen_base >= g.request.output_tokens:
                finished.append(g)
        if connector is not None:
            connector.step_ended(now)
        for g in finished:
            self._retire(g, now)

    def complete_run(self, run: RunWeights, now: float) -> None:
        raise NotImplementedError("sglang runs no macro-steps")

    def _retire(self, g: SequenceGroup, now: float) -> None:
        s = g.seq_ids.pop()
        self.alloc.finish(s)
        g.last_token = g.finish = now
        self.running.remove(g)
        del self._tokens[g]
        self._page_keys.pop(g, None)
        self._end(g, Status.FINISHED, None)
