"""Cache tiers under ``scheduler.policy: sglang`` (SGLang's HiCache host tier and below):
pages named by their chained content, each write policy and a load worked out by hand
through the scheduler, the books under random workloads (hypothesis: radix cache and tiers
checked after every step), and a run from a config."""

from __future__ import annotations

from pathlib import Path

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from tier_cases import multi_turn_config, run_steps, tier_stack

from kvsim.policies.indexes.radix_cache import PageChain, RadixCacheAllocator, request_tokens
from kvsim.policies.tiers.tier_stack import TierStack
from kvsim.simulator.config import load_config
from kvsim.simulator.engine.runner import run_experiment
from kvsim.simulator.sched.sequence import Status
from kvsim.simulator.sched.sglang import SchedulerSGLang, SGLangSettings
from kvsim.traces import Request

P = 4  # tokens per page


def stack(*levels: tuple[int, str, int, str]) -> TierStack:
    """Tiers of (capacity pages, write policy, after-hits N, eviction); links of 1000 B/s and
    1 s per transfer, pages of 1000 bytes: k pages take 1 + k seconds."""
    return tier_stack(*levels, block_tokens=P, block_bytes=1000.0)


def sglang(capacity: int, tiers: TierStack, **knobs) -> tuple[SchedulerSGLang, list]:
    ended: list = []
    alloc = RadixCacheAllocator(capacity, P, knobs.pop("eviction", "lru"))
    settings_ = SGLangSettings(max_seq_len=1024, watermark=0, max_num_batched_tokens=256, **knobs)
    return SchedulerSGLang(alloc, settings_, ended.append, tiers), ended


# --- page names ---------------------------------------------------------------------------------
def test_pages_share_a_name_exactly_when_their_tokens_agree_up_to_the_page_end():
    chain = PageChain(2)
    a = chain.extend((1, 2, 3, 4, 5, 6), [], 3)
    b = chain.extend((1, 2, 3, 4, 9, 9, 5, 6), [], 4)
    c = chain.extend((7, 7, 3, 4), [], 2)
    assert a[:2] == b[:2] and a[2] != b[2] and b[3] != a[2]  # (5, 6) after another page: another name
    assert c[1] != a[1]  # the same tokens (3, 4) under another first page
    assert chain.extend((1, 2, 3, 4, 5, 6), a[:1], 3) == a  # grown from a known prefix: the same


# --- loads and stores through the scheduler -------------------------------------------------------
def three_requests() -> list[Request]:
    """Request 0 computes prefix p0 (16 tokens: 4 pages); request 1 (prefix p1) needs the
    whole 20-slot cache, so the tree evicts p0; request 2 (prefix p0, 13 tokens: a match is
    capped at 12, 3 pages) arrives at 10 and finds p0 only in the tier."""
    return [Request(0, 0.0, 17, 1, prefix_id="p0", prefix_tokens=16),
            Request(1, 5.0, 17, 1, prefix_id="p1", prefix_tokens=16),
            Request(2, 10.0, 13, 1, prefix_id="p0", prefix_tokens=12)]


def third_of_three(level: tuple[int, str, int, str]):
    """``three_requests`` through a 20-page tree over one tier ``level`` (as ``stack``'s):
    the tiers, the scheduler, and the third request's ended group."""
    tiers = stack(level)
    s, ended = sglang(20, tiers)
    run_steps(s, three_requests())
    return tiers, s, {g.request.request_id: g for g in ended}[2]


def test_write_through_the_third_request_loads_its_prefix_from_the_tier():
    """p0's 4 pages are written through at 1 (ready at 6), p1's at 6 (the link is busy until
    11). Request 2 loads 3 pages, queued behind p1's store: from 11 to 15 (1 + 3 s). At 15
    its pages join the tree; it is admitted with a 12-token hit that counts no lookup again."""
    tiers, s, g = third_of_three((100, "write-through", 0, "lru"))
    assert (g.loaded_tokens, g.load_wait, g.first_scheduled, g.cached_tokens) == (12, 5.0, 15.0, 12)
    t0 = tiers.stats()["t0"]
    assert (t0["hit_blocks"], t0["stored_blocks"], t0["evictions"]) == (3, 8, 0)
    assert t0["load_bytes"] == 3000 and t0["store_bytes"] == 8000 and t0["link_busy_s"] == 5 + 5 + 4
    assert s.alloc.prefix_lookups == 17 + 17 + 13 and s.alloc.prefix_hits == 0  # loaded: not radix hits
    assert s.alloc.evictions == 16 + 16  # p0 for request 1, p1 for request 2's load


def test_write_through_names_each_page_with_its_chain_parent():
    """Request 1 hits request 0's 4 pages of p0 and computes 2 more pages of the prefix: the
    tier stores those with the page before each as its parent (the hit's last page for the
    first), so leaf-only eviction sees one chain."""
    tiers = stack((100, "write-through", 0, "lru"))
    s, ended = sglang(200, tiers)
    reqs = [Request(0, 0.0, 17, 1, prefix_id="p0", prefix_tokens=16),
            Request(1, 3.0, 25, 1, prefix_id="p0", prefix_tokens=24)]
    run_steps(s, list(reqs))
    keys = s.alloc.pages.extend(request_tokens(reqs[1], 1), [], 6)
    meta = tiers.levels[0].tier.meta
    assert [meta[k][0] for k in keys] == [None, *keys[:5]]
    assert len(meta) == 6 and ended[1].cached_tokens == 16


def test_write_back_stores_what_the_tree_evicts_after_the_loads_of_that_scheduling():
    """p0 is evicted (and written back: 1 + 4 s) when request 1 is admitted at 5, so it is
    ready at 10; request 2's load at 10 evicts p1, whose store goes out after the load: the
    load runs 10 to 14, the store 14 to 19."""
    tiers, s, g = third_of_three((100, "write-back", 0, "lru"))
    assert (g.loaded_tokens, g.load_wait, g.first_scheduled) == (12, 4.0, 14.0)
    t0 = tiers.stats()["t0"]
    assert (t0["hit_blocks"], t0["stored_blocks"]) == (3, 8)
    assert tiers.levels[0].link.free_at == 19.0
    # the evicted pages keep their chain: p1's first page has no parent, each next the one before
    p1 = [k for k, (parent, _) in tiers.levels[0].tier.meta.items() if parent is None]
    assert len(p1) == 2  # the first pages of p0 and of p1


def test_a_full_tier_evicts_and_the_prefix_is_computed_again():
    """A tier of 4 pages: storing p1's pages evicts p0's (lru), so request 2 finds nothing
    below the tree and computes its prompt; its 3 pages are written through in turn, evicting
    3 of p1's."""
    tiers, s, g = third_of_three((4, "write-through", 0, "lru"))
    assert (g.loaded_tokens, g.load_wait, g.cached_tokens, g.first_scheduled) == (0, 0.0, 0, 10.0)
    t0 = tiers.stats()["t0"]
    assert (t0["stored_blocks"], t0["evictions"], t0["hit_blocks"]) == (4 + 4 + 3, 4 + 3, 0)


def test_write_through_after_hits_stores_a_page_at_its_nth_hit():
    """Requests 0 and 1 share p0 (16 tokens); request 1's admission hits its 4 pages once
    (N = 1): they go to the tier in that scheduling's batch; request 0's prompt, never hit,
    does not."""
    tiers = stack((100, "write-through-after-hits", 1, "lru"))
    s, ended = sglang(200, tiers)
    run_steps(s, [Request(0, 0.0, 17, 1, prefix_id="p0", prefix_tokens=16),
                  Request(1, 3.0, 21, 1, prefix_id="p0", prefix_tokens=16)])
    t0 = tiers.stats()["t0"]
    assert t0["stored_blocks"] == 4 and t0["link_busy_s"] == 5.0
    assert sorted(t0 for t0 in tiers.levels[0].tier.ready_s.values()) == [8.0] * 4  # sent at 3


def test_a_load_that_finds_no_room_stops_admission():
    """The tier holds p0 (ready at 6), but request 1 (admitted at 7, evicting p0 from the
    tree) locks p1 and holds a private page until it finishes at 10: at 8 and 9 the load's 12
    slots are more than the 4 available, so request 2 is blocked. At 10 it loads, behind p1's
    store on the link (8 to 13): from 13 to 17."""
    tiers = stack((100, "write-through", 0, "lru"))
    s, ended = sglang(24, tiers)
    reqs = [Request(0, 0.0, 17, 1, prefix_id="p0", prefix_tokens=16),
            Request(1, 7.0, 17, 3, prefix_id="p1", prefix_tokens=16),  # holds 20 slots until 10
            Request(2, 8.0, 13, 1, prefix_id="p0", prefix_tokens=12)]
    run_steps(s, reqs)
    g = {g.request.request_id: g for g in ended}[2]
    assert (g.loaded_tokens, g.load_wait, g.first_scheduled, g.cached_tokens) == (12, 7.0, 17.0, 12)



def test_a_load_after_a_partial_radix_hit_counts_that_hit():
    """Pages of 4 tokens, 40 slots, after-hits N = 1. A (24 tokens, 6 pages) + 1 own token
    computes at 0; request 1 (A + 1) hits A's 6 pages at 3: their first hit, so all 6 go to
    the tier in that scheduling's batch (1 + 6 s: ready at 10); request 2 (A's first 2 pages,
    then its own) hits 2 pages at 5, splitting A's node; request 3 (16 tokens of its own) at
    7 needs the room A's tail (4 pages, used longest ago) held. Request 4 (A + 1) at 10: a
    radix hit of 8 tokens and A's other 4 pages from the tier (10 to 15: 1 + 4 s); its load
    counts that hit (8 more radix hit tokens: 24 + 8 + 8 = 40), and it is admitted at 15
    with all 24 tokens cached."""
    tiers = stack((100, "write-through-after-hits", 1, "lru"))
    s, ended = sglang(40, tiers)

    def req(rid, t, tokens):
        return Request(rid, t, len(tokens), 1, token_ids=tuple(tokens))

    a = list(range(24))
    run_steps(s, [req(0, 0.0, a + [100]), req(1, 3.0, a + [101]), req(2, 5.0, a[:8] + list(range(200, 216))),
                  req(3, 7.0, list(range(300, 316))), req(4, 10.0, a + [102])])
    g = {g.request.request_id: g for g in ended}[4]
    assert (g.loaded_tokens, g.load_wait, g.first_scheduled, g.cached_tokens) == (16, 5.0, 15.0, 24)
    assert s.alloc.prefix_hits == 40
    t0 = tiers.stats()["t0"]
    assert (t0["stored_blocks"], t0["hit_blocks"], t0["link_busy_s"]) == (6, 4, 7.0 + 5.0)


def load_beside_a_decoder(until: int, *extra: Request) -> SchedulerSGLang:
    """Pages of 1 token (a page takes 0.1 s on the link, after 1 s per transfer), 60 slots,
    conservativeness 0.01 (the reservation is negligible). X (8 tokens) + 1 computes at 0
    and is written through (ready at 2.9); R (prompt 10, output 47) prefills at 1; a
    45-token request at 2 evicts X from the tree; R decodes from 3 on. L (X + 1) arrives at
    44, when R holds 51 slots and 9 are available: it finds X's 8 pages in the tier, 8 < 9
    less a reservation under 1, so it loads them (44 to 45.8) into 8 fresh slots. The
    scheduler after the steps 0 .. ``until - 1`` (``extra`` requests arrive too)."""
    tiers = tier_stack((100, "write-through", 0, "lru"), block_tokens=1, block_bytes=100.0)
    s = SchedulerSGLang(RadixCacheAllocator(60, 1), SGLangSettings(max_seq_len=1024, watermark=0,
                        max_num_batched_tokens=256, schedule_conservativeness=0.01), lambda g: None, tiers)
    x8 = list(range(8))
    pending = [Request(0, 0.0, 9, 1, token_ids=tuple(x8 + [100])),
               Request(1, 1.0, 10, 47, token_ids=tuple(range(200, 210))),
               Request(3, 2.0, 45, 1, token_ids=tuple(range(400, 445))),
               Request(2, 44.0, 9, 2, token_ids=tuple(x8 + [101])), *extra]
    for t in range(until):
        s.finish_loads(float(t))
        for r in [r for r in pending if r.arrival_time == t]:
            s.add(r, float(t))
        x = s.schedule(float(t))
        if not x.empty:
            s.complete(x, float(t + 1))
        assert x.preempted_recompute == 0
    assert [(load[0], load[2].request.request_id) for load in s.loading] == [(44 + 1 + 0.8, 2)]
    s.finish_loads(float(until))
    return s


def test_the_last_running_request_is_retracted_when_a_load_holds_its_next_slot():
    """``load_beside_a_decoder``: at 44 R's token takes the last slot the load left. At 45
    R's next token has no slot and only the load holds memory: R is retracted (not kept to
    fail), its own KV freed, and waits; with no request left the ratio is 0."""
    s = load_beside_a_decoder(45)
    assert s.alloc.available() == 0 and [g.request.request_id for g in s.running] == [1]
    x = s.schedule(45.0)
    assert (x.preempted_recompute, x.decode, s.running) == (1, [], [])
    assert [(g.request.request_id, g.status) for g in s.waiting] == [(1, Status.WAITING)]
    assert s.alloc.available() == 52 and s.new_token_ratio == 0.0


def test_the_last_running_request_stays_when_its_next_slot_is_there():
    """``load_beside_a_decoder`` with Y (R's first 6 tokens, output 3) arriving at 43: it
    hits 5 tokens and computes the 6th, a copy of R's (prefill only: R waits). At 44 L
    loads, R and Y decode into the last 2 slots. At 45 both need one: Y (fewest generated)
    is retracted, freeing its 1 own token; R alone needs 1 slot and 1 is available: it
    stays, though the load is still running, and decodes into it."""
    s = load_beside_a_decoder(45, Request(4, 43.0, 6, 3, token_ids=tuple(range(200, 206))))
    assert s.alloc.available() == 0 and [g.request.request_id for g in s.running] == [1, 4]
    x = s.schedule(45.0)
    assert x.preempted_recompute == 1 and [g.request.request_id for g in x.decode] == [1]
    assert [(g.request.request_id, g.status) for g in s.waiting] == [(4, Status.WAITING)]
    assert s.alloc.available() == 0 and s.loading

@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(write=st.sampled_from(["write-through", "write-through-after-hits", "write-back"]),
       policy=st.sampled_from(["lru", "lfu", "fifo", "arc", "priority"]),
       queue=st.sampled_from(["lpm", "fcfs", "dfs-weight"]),
       capacity=st.integers(48, 120), cpu=st.integers(0, 12),
       reqs=st.lists(st.tuples(st.integers(0, 3), st.integers(1, 30), st.integers(1, 12), st.integers(0, 2),
                               st.integers(0, 30)), min_size=1, max_size=12))
@example(write="write-through-after-hits", policy="lru", queue="lpm", capacity=52, cpu=3,
         reqs=[(0, 1, 1, 0, 0), (0, 1, 1, 0, 0), (0, 1, 1, 0, 0), (2, 1, 1, 0, 0), (0, 1, 1, 0, 0),
               (0, 1, 1, 0, 1), (0, 2, 1, 0, 3), (0, 1, 4, 0, 0), (0, 2, 2, 0, 0), (1, 1, 1, 0, 7),
               (0, 1, 3, 0, 19), (2, 18, 7, 2, 18)])
def test_books_balance_after_every_step_with_tiers(write, policy, queue, capacity, cpu, reqs):
    """Every request ends; after every step the radix cache's books (locks, sizes, slots) and
    each tier's (size within capacity, eviction order and child counts exact) balance. The
    example: loads once took the slots a running request had been promised, and the last
    running request could not decode (the engine raised); a load now respects the running
    requests' reservation, and a last request whose slot loads hold is retracted."""
    tiers = stack((cpu, write, 1, policy), (cpu // 2, "write-back", 0, "lru"))
    s, ended = sglang(capacity, tiers, eviction=policy, schedule_policy=queue, chunked_prefill_size=16)
    pending = [Request(i, float(t), 16 + own, out, prefix_id=f"p{p}", prefix_tokens=16, priority=prio)
               for i, (p, own, out, prio, t) in enumerate(reqs)]
    n = len(pending)
    run_steps(s, pending)
    assert not pending and not s.has_work and not s.alloc.held and len(ended) == n


# --- from a config ------------------------------------------------------------------------------
def test_a_cpu_tier_under_sglang_loads_from_a_config(tmp_path: Path):
    p = tmp_path / "c.yaml"
    p.write_text(multi_turn_config(
        name="tiers-sglang", hardware="kv_cache_gib: 0.5", conversations=30, max_turns=4,
        scheduler="{policy: sglang, max_num_seqs: 64}", tiers="[{name: cpu, capacity_gib: 2}]"))
    run = run_experiment(*load_config(p))
    assert run.summary["tier_cpu_hit_blocks"] > 0 and run.summary["mean_ttft_load_ms"] > 0
    assert run.summary["tier_cpu_loaded_tokens"] == run.requests["loaded_tokens"].sum()
    assert (run.requests["status"] == "finished").all()
