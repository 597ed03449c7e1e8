"""Tier stacks and a step loop shared by the cache-tier tests of vllm-v1, sglang and vllm-v0
(``test_cache_tiers.py``, ``test_cache_tiers_sglang.py``, ``test_cache_tiers_v0.py``): tiers whose links take a round
number of seconds, and a scheduler driven one step a second with every book checked after
each step."""

from __future__ import annotations

from kvsim.policies.tiers.cache_tier import CacheTier
from kvsim.policies.tiers.tier_stack import Level, TierLink, TierStack
from kvsim.traces import Request

LINK_BYTES_PER_S = 1000.0
LINK_LATENCY_S = 1.0


def tier_stack(*levels: tuple[int, str, int, str], block_tokens: int,
               block_bytes: float) -> TierStack:
    """Tiers ``t0``, ``t1``, ... of (capacity in blocks, write policy, after-hits N, eviction
    policy) over blocks of ``block_tokens`` tokens and ``block_bytes`` bytes, each behind a
    link of 1000 B/s and 1 s a transfer."""
    return TierStack([Level(CacheTier(f"t{i}", cap, ev), TierLink(LINK_BYTES_PER_S, LINK_LATENCY_S),
                            write, n)
                      for i, (cap, write, n, ev) in enumerate(levels)], block_tokens, block_bytes)


def run_steps(s, pending: list[Request], steps: int = 600) -> None:
    """Runs scheduler ``s`` (v1, sglang or v0) one step a second from t=0 until ``pending`` is
    all added and ``s`` has no work, or ``steps`` steps: loads end when their time has
    come, requests are added at their arrival, and the allocator's and every tier's books
    are checked after each step. Raises if the work is not done within ``steps``."""
    for t in range(steps):
        s.finish_loads(float(t))
        for r in [r for r in pending if r.arrival_time <= t]:
            s.add(r, float(t))
            pending.remove(r)
        x = s.schedule(float(t))
        if not x.empty:
            s.complete(x, float(t + 1))
        s.alloc.check()
        for level in s.tiers.levels:
            level.tier.check()
        # the fast path reads the next load's end as a plain attribute: it must track the heap
        assert s.next_load_s == min((load[0] for load in s.loading), default=float("inf"))
        if not pending and not s.has_work:
            return
    raise AssertionError(f"the requests did not all end within {steps} steps")


def multi_turn_config(*, name: str, hardware: str, conversations: int, max_turns: int,
                      scheduler: str, tiers: str, prefix_caching: bool = False,
                      macro_steps: bool | None = None) -> str:
    """The YAML text of a run of Llama-3-8B on an H100 serving multi-turn conversations (a
    300-token system prompt, 2-``max_turns`` turns of 20-100 user and output tokens, 2 s of
    thought between turns, 4 new conversations a second) from a paged cache of 16-token
    blocks with ``tiers`` below it. ``hardware``, ``scheduler`` and ``tiers`` are YAML flow
    text (``"num_gpu_blocks: 300"``, ``"{policy: sglang}"``, ``"[{name: cpu, capacity_gib: 2}]"``);
    ``macro_steps`` None leaves the engine's default."""
    lines = [
        f"name: {name}",
        "seed: 1",
        "model: {name: llama-3-8b}",
        f"hardware: {{gpu: h100-sxm, {hardware}}}",
        "workload:",
        "  multi_turn:",
        f"    conversations: {conversations}",
        "    conversation_rate: 4.0",
        f"    turns: {{min: 2, max: {max_turns}}}",
        "    system_prompt_tokens: 300",
        "    user_tokens: {min: 20, max: 100}",
        "    output_tokens: {min: 20, max: 100}",
        "    think_time_s: 2.0",
        "allocator:",
        "  kind: paged",
        "  block_size: 16",
        *(["  prefix_caching: true"] if prefix_caching else []),
        f"  tiers: {tiers}",
        f"scheduler: {scheduler}",
        *([] if macro_steps is None else [f"engine: {{macro_steps: {str(macro_steps).lower()}}}"]),
        "metrics: {step_table: false}",
    ]
    return "\n".join(lines) + "\n"
