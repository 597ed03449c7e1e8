"""The reference engine's SGLang rules (``scheduler.policy: sglang``), one step per iteration.

The oracle for ``simulator.sched.sglang`` and the place to learn SGLang's scheduling
(DESIGN.md, "Engine and scheduler"; SGLang's ``scheduler.py``, ``schedule_policy.py`` and
``schedule_batch.py``). The memory is ``policies.reference.radix.ReferenceRadixCache``.
One step (``schedule``):

1. **Prefill, if any.** The request mid-prefill (at most one) computes its next chunk
   first. Then the waiting queue, in ``schedule_policy`` order, is admitted head first
   while ``max_num_seqs`` allows and each request fits: it locks its cached prefix (at
   most its tokens - 1), and needs ``uncached tokens + min(output left, 4096)`` slots
   below what was available before this step's allocations less the *reservation*:
   ``new_token_ratio`` x min(output left, 4096) of every running request, one slot per
   running request in a mixed step, and what the requests admitted before it in this step
   compute plus their whole (clipped) output. A request that does not fit stops
   admission. Prompt tokens per step: at most ``max_num_batched_tokens`` (a request
   reaching it stops admission unless the step has no prefill yet), and chunks of
   ``chunked_prefill_size`` (whole pages): the request cut there continues next step.
2. A step with prefill is prefill only, unless ``enable_mixed_chunk``: then the running
   requests decode in it too, if their next tokens fit.
3. **Else decode.** Every running request appends a token. If they do not fit, retract
   (recompute later) the one with the fewest generated tokens (ties: the longest prompt,
   then the latest to join) until 20 tokens per remaining request fit or one remains; the
   ratio becomes min(1, (generated + 20 x remaining) / (their outputs + 1)). A decode step
   that needs no retraction lowers the ratio by (initial - floor) / 600, to the floor.

Queue orders: ``fcfs`` (queue order); ``lpm`` (longest cached prefix first; the queue
order when more than 128 wait; a request whose cached prefix is under 32 tokens and whose
first 32 tokens equal those of another such request ahead of it goes to the back);
``dfs-weight`` (depth first over the tree from the root, at each node its children holding
more waiting requests' cached prefixes first, then the requests whose prefix ends there).
Ratio: starts at 0.7 x ``schedule_conservativeness`` (at most 1), floor 0.14 x that.

After the step (``complete``): decoders gain their token; every prefill chunk joins the
tree; a request whose prefill is done samples a token (its first: TTFT) and joins the
running batch; requests with all their output finish (their tokens join the tree).

Cache tiers (``allocator.tiers``: SGLang's HiCache host tier and below; the tiers are
``simulator.reference.vllm.ReferenceTiers``, SimPy links, a process per transfer). A tier holds
pages (``page_size`` tokens), each named by its sequence's tokens up to its end. When a
waiting request is considered (in queue order, after the ``max_num_seqs`` check) and has
locked its cached prefix, the pages after it, up to the match cap (tokens - 1, whole
pages), are looked up in the tiers page by page (the top tier holding one ready provides
it) up to the first page none has. If any is found the request *loads* instead of being
admitted: it needs that many pages of slots available (free or evictable; else admission
stops), counts its lookup and hit now, keeps its prefix locked, takes fresh slots for the
pages (which may evict) and waits outside the queue and the batch; admission goes on with
the next request. When its last transfer ends, the pages join the tree (those cached
meanwhile are duplicates, freed), it lets go of its slots and lock and goes back to the
*front* of the waiting queue; its next admission counts no lookup and no hit. Stores:
``write-through`` the pages a prefill chunk puts in the tree (at the step's end),
``write-through-after-hits`` a page at its N-th hit at admission (or load), ``write-back``
the pages the tree evicts (batched at the end of the scheduling, after its loads).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from kvsim.policies.reference.radix import RadixNode, ReferenceRadixCache
from kvsim.simulator.cost_model.base import CostModel
from kvsim.simulator.reference.vllm import Group, ReferenceReplica, Rules, Step
from kvsim.traces import Request

CLIP_OUTPUT = 4096  # most output tokens a request's reservation counts
RETRACT_STEPS = 20  # decode tokens per remaining request a retraction makes room for
LPM_MAX_QUEUE = 128  # lpm sorts only queues this long or shorter
IN_BATCH_TOKENS = 32  # lpm: prefixes shorter than this are compared within the queue


def request_tokens(request: Request) -> tuple:
    """Names of a request's tokens, prompt then output: equal names are the same token.
    Real token ids are themselves, and so are the answer's (``output_token_ids``, when the
    request knows them); token j of Mooncake hash block h is named by (h, j), token j of a
    named prefix by (prefix, j); every other token belongs to the request alone. Names are ints in disjoint ranges (a tuple per token costs too much memory on
    40K-token prompts): real ids below 2^40, hash tokens at 2^40 + h x 2^20 + j, a
    request's own token i at -(request x 2^40 + i) - 1."""
    P, total = request.prompt_tokens, request.prompt_tokens + request.output_tokens
    names: list = []
    if request.token_ids is not None:
        names += request.token_ids
        if getattr(request, "output_token_ids", None) is not None:
            names += request.output_token_ids
    elif request.hash_ids:
        hb = request.hash_block_tokens
        assert hb < 2**20, "hash blocks of 2^20 tokens or more"
        for h in request.hash_ids:
            n = min(hb, P - len(names))
            if n <= 0:
                break
            names += range(2**40 + h * 2**20, 2**40 + h * 2**20 + n)
    elif request.prefix_id is not None and request.prefix_tokens:
        names += [("prefix", request.prefix_id, j) for j in range(min(request.prefix_tokens, P))]
    own = request.request_id * 2**40
    names += range(-(own + len(names)) - 1, -(own + total) - 1, -1)
    return tuple(names)


@dataclass(eq=False)
class SGLangRequest(Group):
    """One request under sglang: its token names and how far its current prefill goes."""

    tokens: tuple = ()
    target: int = 0  # tokens its current prefill computes to (prompt + generated then)
    after_load: bool = False  # back from a load: its next admission counts no lookup, no hit

    @property
    def seq(self) -> int:
        return self.seqs[0]

    @property
    def tokens_to_compute(self) -> int:
        """Prompt plus what it generated before a retraction."""
        return self.request.prompt_tokens + self.generated

    @property
    def output_left(self) -> int:
        return min(self.request.output_tokens - self.generated, CLIP_OUTPUT)


class ReferenceSGLangReplica(ReferenceReplica):
    """One replica's waiting queue, running batch and request mid-prefill, under SGLang's rules."""

    def __init__(self, index: int, alloc: ReferenceRadixCache, cost: CostModel, rules: Rules,
                 seed: int, on_end: Callable[[Group, int], None]):
        super().__init__(index, alloc, cost, rules, seed, on_end)
        self.waiting: list[SGLangRequest] = []  # a list: it is sorted every step
        self.chunked: SGLangRequest | None = None  # mid-prefill, not yet running
        start = min(0.7 * rules.schedule_conservativeness, 1.0)
        self.floor = min(start * 0.14, 1.0)
        self.decay = (start - self.floor) / 600
        self.new_token_ratio = start

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running or self.chunked)

    def add(self, request: Request, now: float) -> None:
        """A request arrives: it waits, or is rejected if it can never run."""
        self.now = now
        seq, self.next_seq = self.next_seq, self.next_seq + 1
        P, out, cap = request.prompt_tokens, request.output_tokens, self.alloc.capacity
        g = SGLangRequest(request, [seq], {seq: out}, P, [], tokens=request_tokens(request))
        if request.num_seqs > 1:
            self.end(g, "rejected", "sglang runs one sequence per request")
        elif P + out > self.rules.max_seq_len:
            self.end(g, "rejected", f"prompt + output = {P + out} tokens exceeds the context window "
                                    "(model.context_len_tokens) "
                     f"{self.rules.max_seq_len}")
        elif P + min(out, CLIP_OUTPUT) >= cap or P + out - 1 > cap:  # admission could never pass,
            # or its whole KV is more than the cache
            self.end(g, "rejected", f"needs more KV slots than the whole cache ({cap})")
        else:
            self.waiting.append(g)

    # --- one iteration ------------------------------------------------------------------------
    def schedule(self, now: float) -> Step:
        self.now = now
        step = Step()
        self.prefill(step)
        if step.prefill:
            if self.rules.enable_mixed_chunk and self.running and self.decode_fits():
                self.decode(step)
        elif self.running:
            if self.decode_fits():
                self.new_token_ratio = max(self.new_token_ratio - self.decay, self.floor)
            else:
                self.retract(step)
            self.decode(step)
        self.send_stores()
        return step

    def prefill(self, step: Step) -> None:
        """The request mid-prefill continues, then waiting requests are admitted while they fit."""
        alloc, rules, P = self.alloc, self.rules, self.alloc.page_size
        mixed = rules.enable_mixed_chunk and bool(self.running)
        reservation = sum(g.output_left for g in self.running) * self.new_token_ratio
        reservation += len(self.running) if mixed else 0
        allocated = 0  # slots this step's prefills took (what was available before them is
        # what is available now plus these)
        tokens_left = rules.max_num_batched_tokens
        chunk_left = rules.chunked_prefill_size  # None: no chunking
        self.blocked = None

        def chunk_of(wanted: int) -> int:
            return wanted if chunk_left is None or wanted <= chunk_left else chunk_left // P * P

        g = self.chunked
        if g is not None:
            n = chunk_of(g.target - alloc.kv_len(g.seq))
            last = n == g.target - alloc.kv_len(g.seq)
            allocated = alloc.slots_to_extend(g.seq, n)
            if n <= 0 or not alloc.extend(g.seq, n):
                self.blocked = "no space" if self.waiting else None
                return
            self.add_chunk(g, n, step)
            reservation += n + (g.output_left if last else 0)
            tokens_left -= n
            chunk_left = None if chunk_left is None else chunk_left - n
            if not last:
                self.blocked = "limits" if self.waiting else None
                return
            self.chunked = None
        if not self.waiting:
            return
        if len(self.running) + len(step.prefill) >= rules.max_num_seqs:
            self.blocked = "limits"
            return
        self.order_queue()
        admitted = []  # taken out of the queue: admitted, or loading from a cache tier
        for g in self.waiting:
            if len(self.running) + len(step.prefill) >= rules.max_num_seqs:
                self.blocked = "limits"
                break
            T = g.tokens_to_compute
            hit = alloc.open(g.seq, g.tokens, T, g.request.prompt_tokens + g.request.output_tokens - 1,
                             g.request.priority)
            if self.tiers is not None:
                found = self.tiers.lookup(self.page_names(g, hit // P, (T - 1) // P))
                if found:
                    # the running requests' reservation holds for a load as for a prefill
                    if len(found) * P >= alloc.available() + allocated - reservation:
                        self.blocked = "no space"
                        alloc.release(g.seq)
                        break
                    self.start_load(g, hit, found, T)
                    admitted.append(g)
                    continue
            uncached = T - hit
            n = chunk_of(uncached)
            slots = alloc.slots_to_extend(g.seq, n)
            if uncached + g.output_left >= alloc.available() + allocated - reservation:
                self.blocked = "no space"
            elif (uncached >= tokens_left and step.prefill) or n <= 0:
                self.blocked = "limits"
            elif not alloc.extend(g.seq, n):
                self.blocked = "no space"
            if self.blocked is not None:
                alloc.release(g.seq)
                break
            if g.after_load:  # counted when its load started
                g.after_load = False
            else:
                alloc.count_lookup(T, hit)
                self.count_gpu_hits(g, hit)
            allocated += slots
            admitted.append(g)
            g.prompt_len, g.cached_tokens, g.target = T, hit, T
            step.cached_tokens += hit
            g.status = "running"
            if g.scheduled_s is None:
                g.scheduled_s = self.now
            self.add_chunk(g, n, step)
            if n < uncached:
                self.chunked = g
                reservation += n
            else:
                reservation += n + g.output_left
            tokens_left -= n
            chunk_left = None if chunk_left is None else chunk_left - n
            if (self.chunked is not None or alloc.available() + allocated - reservation <= 0
                    or tokens_left <= 0 or (chunk_left is not None and chunk_left <= 0)):
                self.blocked = "limits" if len(self.waiting) > len(admitted) else None
                break
        self.waiting = [g for g in self.waiting if g not in admitted]

    # --- loads from cache tiers (allocator.tiers) ----------------------------------------------
    def page_names(self, g: SGLangRequest, first: int, stop: int):
        """Names of ``g``'s pages ``first`` .. ``stop - 1``: its tokens up to each page's end."""
        P = self.alloc.page_size
        return (tuple(g.tokens[:(j + 1) * P]) for j in range(first, stop))

    def page_entries(self, g: SGLangRequest, first: int, stop: int) -> list:
        """(name, parent's name or None, ``g``'s priority) of ``g``'s pages ``first`` .. ``stop - 1``."""
        P = self.alloc.page_size
        return [(tuple(g.tokens[:(j + 1) * P]), tuple(g.tokens[:j * P]) if j else None, g.request.priority)
                for j in range(first, stop)]

    def start_load(self, g: SGLangRequest, hit: int, found: list[int], T: int) -> None:
        """``g`` (its ``hit`` cached tokens locked) loads the ``len(found)`` pages after them
        (``found``: the tier providing each) into fresh slots, and waits outside the queue."""
        alloc, P, k = self.alloc, self.alloc.page_size, len(found)
        g.after_load = False
        alloc.count_lookup(T, hit)
        self.count_gpu_hits(g, hit)
        alloc.extend(g.seq, k * P)
        g.status = "loading"
        self.loading.append(g)
        keys, start = list(self.page_names(g, hit // P, hit // P + k)), self.now
        self.tiers.start_load(keys, found, g.request.priority,
                              lambda done_s: self.finish_load(g, k, start, done_s))

    def finish_load(self, g: SGLangRequest, k: int, start_s: float, done_s: float) -> None:
        """``g``'s last transfer ended at ``done_s``: its pages join the tree, it lets go of its
        slots and lock, and goes back to the front of the waiting queue."""
        self.alloc.finish(g.seq)
        self.back_from_load(g, k, start_s, done_s)

    def count_gpu_hits(self, g: SGLangRequest, hit: int) -> None:
        """``g``'s admission (or load) hit its first ``hit`` tokens in the tree: one hit of each
        whole page toward write-through-after-hits."""
        if self.tiers is not None and hit:
            self.tiers.gpu_hits(self.page_entries(g, 0, hit // self.alloc.page_size))

    def add_chunk(self, g: SGLangRequest, n: int, step: Step) -> None:
        """``g`` computes ``n`` prompt tokens after the ones it has (causal attention)."""
        before = self.alloc.kv_len(g.seq) - n
        if g.recomputing:
            step.recompute_tokens += n
        step.prefill.append(g)
        step.chunks.append((g, n))
        step.prefill_tokens += n
        step.prefill_pairs += n * before + n * (n + 1) / 2

    def decode_fits(self) -> bool:
        return sum(self.alloc.slots_to_extend(g.seq, 1) for g in self.running) <= self.alloc.available()

    def decode(self, step: Step) -> None:
        for g in self.running:
            if not self.alloc.extend(g.seq, 1):
                raise RuntimeError(f"sglang: no KV slot for request {g.request.request_id}'s next token")
            step.decode.append(g)
            step.decode_seqs += 1
            step.decode_context += self.alloc.kv_len(g.seq)

    def retract(self, step: Step) -> None:
        """Retract until 20 tokens per remaining request fit (or one remains; none, when loads
        from a cache tier hold the slot the last one needs: they give it back when they end);
        reset the ratio."""
        alloc = self.alloc
        while (len(self.running) > 1 and alloc.available() < len(self.running) * RETRACT_STEPS * alloc.page_size
               or self.loading and len(self.running) == 1 and not self.decode_fits()):
            g = min(reversed(self.running), key=lambda g: (g.generated, -g.request.prompt_tokens))
            self.running.remove(g)
            g.recomputed_tokens += alloc.kv_len(g.seq)
            alloc.release(g.seq)
            g.status = "waiting"
            g.recomputing = True
            g.preemptions += 1
            self.waiting.append(g)
            step.preempted_recompute += 1
        generated = sum(g.generated for g in self.running)
        outputs = sum(g.request.output_tokens for g in self.running)
        self.new_token_ratio = min(1.0, (generated + RETRACT_STEPS * len(self.running)) / (outputs + 1))

    # --- queue order ----------------------------------------------------------------------------
    def order_queue(self) -> None:
        policy, waiting = self.rules.schedule_policy, self.waiting
        if policy == "fcfs" or len(waiting) < 2 or (policy == "lpm" and len(waiting) > LPM_MAX_QUEUE):
            return
        matched = [self.alloc.match(g.tokens, g.tokens_to_compute - 1) for g in waiting]
        if policy == "lpm":
            heads, back = [], set()
            for g, (hit, _) in zip(waiting, matched):
                if hit < IN_BATCH_TOKENS and g.tokens_to_compute >= IN_BATCH_TOKENS:
                    head = g.tokens[:IN_BATCH_TOKENS]
                    if head in heads:
                        back.add(id(g))
                    heads.append(head)
            hits = {id(g): hit for g, (hit, _) in zip(waiting, matched)}
            waiting.sort(key=lambda g: (id(g) in back, -hits[id(g)]))
            return
        # dfs-weight
        ends: dict[int, list[SGLangRequest]] = {}
        weight: dict[int, int] = {}
        for g, (_, node) in zip(waiting, matched):
            ends.setdefault(id(node), []).append(g)
            for m in [self.alloc.root] + node.path():
                weight[id(m)] = weight.get(id(m), 0) + 1
        order: list[SGLangRequest] = []

        def visit(node: RadixNode) -> None:
            children = [c for c in node.children.values() if id(c) in weight]
            for c in sorted(children, key=lambda c: -weight[id(c)]):
                visit(c)
            order.extend(ends.get(id(node), []))

        visit(self.alloc.root)
        self.waiting[:] = order

    # --- after the step -------------------------------------------------------------------------
    def complete(self, step: Step, now: float) -> None:
        finished = []
        for g in step.decode:
            self.itl.append((now - g.last_token_s, 1))
            g.last_token_s = now
            g.generated += 1
            if g.generated == g.request.output_tokens:
                finished.append(g)
        filled = []  # pages the prefill chunks put in the tree (write-through)
        for g in step.prefill:
            before = self.alloc.held[g.seq].cached
            self.alloc.cache(g.seq)
            if self.tiers is not None:
                P = self.alloc.page_size
                filled += self.page_entries(g, before // P, self.alloc.held[g.seq].cached // P)
        if filled:
            self.tiers.write_through(filled)
        for g in step.prefill:
            if self.alloc.kv_len(g.seq) < g.target:
                continue  # mid-prefill
            g.recomputing = False
            g.generated += 1
            if g.first_token_s is None:
                g.first_token_s = now
            else:  # recomputed: its gap spans the retraction
                self.itl.append((now - g.last_token_s, 1))
            g.last_token_s = now
            self.running.append(g)
            if g.generated == g.request.output_tokens:
                finished.append(g)
        for g in finished:
            self.alloc.finish(g.seq)
            self.running.remove(g)
            g.finish_s = now
            self.end(g, "finished", None)
