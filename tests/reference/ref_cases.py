"""Hypothesis strategies for differential cases: a small config dict and a few requests.

Every setting the fast path takes a shortcut for is drawn: allocator, placement and
reservation, block size 1-256, prefix caching, swap space (none, tight, ample), preemption
mode and fallback, batch limits, watermark, replicas and router, request-level batching,
measurement windows, parallel samples, beams, shared prefixes and Mooncake hash ids.
Capacities are given in token slots (Llama-2-7B stores 0.5 MiB per token: 2048 per GiB).
"""

from __future__ import annotations

from hypothesis import strategies as st

from kvsim.traces import Request

SLOTS_PER_GIB = 2048  # Llama-2-7B: 2 (K, V) x 32 layers x 4096 x 2 bytes = 0.5 MiB per token
BLOCK_SIZES = [1, 2, 4, 8, 16, 32, 64, 128, 256]
HASH_BLOCK_TOKENS = 256  # every block size divides it


def base_config(max_len: int, kv_slots: int, swap_slots: int) -> dict:
    return {
        "model": {"name": "llama-2-7b", "context_len_tokens": max_len},
        "hardware": {
            "gpu": "a100-80gb",
            "kv_cache_gib": kv_slots / SLOTS_PER_GIB,
            "swap_space_gib": swap_slots / SLOTS_PER_GIB,
        },
        "workload": {
            "arrivals": {"kind": "poisson", "rate": 1.0},
            "num_requests": 1,
            "lengths": {"kind": "fixed", "prompt_tokens": 1, "output_tokens": 1},
        },
    }


@st.composite
def configs(draw) -> dict:
    max_len = draw(st.sampled_from([128, 256, 512]))
    # Mostly tight: a few requests fill it, so groups are preempted, swapped and recomputed.
    kv_slots = draw(
        st.one_of(
            st.integers(max_len, 2 * max_len),
            st.integers(max_len, 2 * max_len),
            st.integers(max_len, 6 * max_len),
        )
    )
    swap = draw(st.sampled_from([0, max_len // 2, 2 * max_len, 8 * max_len]))
    cfg = base_config(max_len, kv_slots, swap)
    if draw(st.booleans()):
        B = draw(st.sampled_from([b for b in BLOCK_SIZES if b <= kv_slots]))
        cfg["allocator"] = {"kind": "paged", "block_size": B, "prefix_caching": draw(st.booleans())}
        batching = draw(st.sampled_from(["iteration", "iteration", "request"]))
    else:
        preset = draw(
            st.sampled_from([None, "orca-max", "orca-pow2", "orca-oracle", "fastertransformer"])
        )
        if preset:
            cfg["allocator"] = {"kind": "contiguous", "preset": preset}
            batching = "request" if preset == "fastertransformer" else "iteration"
        else:
            cfg["allocator"] = {
                "kind": "contiguous",
                "placement": draw(
                    st.sampled_from(["buddy", "buddy_exact", "first_fit", "best_fit"])
                ),
                "reservation": draw(st.sampled_from(["max", "pow2", "oracle"])),
            }
            batching = draw(st.sampled_from(["iteration", "iteration", "request"]))
    cfg["allocator"]["watermark"] = draw(st.sampled_from([0.0, 0.01, 0.1]))
    max_num_seqs = draw(st.sampled_from([1, 2, 3, 4, 8, 256, 256]))
    budget = draw(st.sampled_from([max_len, max_len + 100, 4 * max_len]))
    cfg["scheduler"] = {
        "max_num_seqs": max_num_seqs,
        "max_num_batched_tokens": max(budget, max_num_seqs),  # a decode step fits the budget
        "batching": batching,
        "router": draw(st.sampled_from(["round_robin", "least_outstanding_tokens"])),
    }
    cfg["engine"] = {"macro_steps": draw(st.sampled_from([True, True, True, False]))}
    cfg["hardware"]["num_replicas"] = draw(st.sampled_from([1, 1, 2, 3]))
    cfg["preemption"] = {
        "mode": draw(st.sampled_from(["recompute", "swap", "swap", "auto"])),
        "swap_fallback": draw(st.sampled_from(["recompute", "abort"])),
        "overlap_swap": draw(st.sampled_from([False, False, True])),
    }
    cfg["decoding"] = {
        "sample_lengths": draw(st.sampled_from(["same", "independent"])),
        "beam_concentration": draw(st.sampled_from([0.0, 1.0, 3.0])),
    }
    return draw_window_and_seed(draw, cfg, starts=(None, 0.05, 0.5), ends=(None, 1.0, 3.0))


def next_request(draw, t: float, sharing: str, mixed: list[str],
                 max_len: int) -> tuple[float, str, int]:
    """The next request's arrival (``t`` plus a gap, s), its kind (``sharing``, or one of
    ``mixed`` when that is "mixed") and its prompt length (tokens: mostly up to half the
    context; one in ten up to 8 past it, so a few are rejected on arrival)."""
    t += draw(st.sampled_from([0.0, 0.0, 0.0013, 0.011, 0.011, 0.07, 0.31]))
    kind = sharing if sharing != "mixed" else draw(st.sampled_from(mixed))
    long = not draw(st.integers(0, 9))
    prompt = draw(st.integers(1, max_len + 8) if long else st.integers(1, max_len // 2))
    return t, kind, prompt


def shared_prefix(draw, kind: str, prompt: int, max_len: int) -> dict:
    """A request's fields that share a prefix: by id (``kind`` "prefix": one of three ids over
    16 tokens to the whole context) or by Mooncake hash ids (``kind`` "hash": one of four ids
    per block); none for any other kind."""
    if kind == "prefix":
        return {"prefix_id": f"p{draw(st.integers(0, 2))}",
                "prefix_tokens": draw(st.sampled_from([16, 64, 100, prompt, max_len]))}
    if kind == "hash":
        blocks = -(-prompt // HASH_BLOCK_TOKENS)
        ids = draw(st.lists(st.integers(0, 3), min_size=blocks, max_size=blocks))
        return {"hash_ids": tuple(ids), "hash_block_tokens": HASH_BLOCK_TOKENS}
    return {}


@st.composite
def workloads(
    draw, max_len: int, prefix_caching: bool = False, min_count: int = 1, max_count: int = 16
) -> list[Request]:
    count = draw(st.integers(min_count, max_count))
    kinds = (
        ["prefix", "hash", "mixed"]
        if prefix_caching
        else ["none", "none", "samples", "beams", "prefix", "mixed"]
    )
    sharing = draw(st.sampled_from(kinds))
    requests, t = [], 0.0
    for i in range(count):
        mixed = ["none", "samples", "beams", "prefix", "hash"]
        t, kind, prompt = next_request(draw, t, sharing, mixed, max_len)
        output = draw(st.integers(1, max_len // 2))
        if kind == "samples":
            extra: dict = {"n": draw(st.integers(2, 3))}
        elif kind == "beams":
            extra = {"beam_width": draw(st.integers(2, 3))}
        else:
            extra = shared_prefix(draw, kind, prompt, max_len)
        requests.append(Request(i, round(t, 6), prompt, output, **extra))
    return requests


@st.composite
def cases(draw, max_count: int = 16) -> tuple[dict, list[Request]]:
    cfg = draw(configs())
    caching = cfg["allocator"].get("prefix_caching", False)
    return cfg, draw(workloads(cfg["model"]["context_len_tokens"], caching, max_count=max_count))


# --- vllm-v1 ------------------------------------------------------------------------------------
@st.composite
def v1_configs(draw, prefix_caching: bool | None = None) -> dict:
    """``scheduler.policy: vllm-v1``: small token budgets so prompts are chunked, long-prefill
    thresholds, partial-prefill limits, full-input reservation on and off, small caches so
    running requests preempt each other, block sizes 1-256, 1-3 replicas. Lengths that are
    not powers of two leave the cache's whole blocks short of ``model.context_len_tokens``, so requests
    that fit the model but not the cache are rejected."""
    max_len = draw(st.sampled_from([100, 128, 200, 256, 512]))
    kv_slots = draw(st.one_of(st.integers(max_len, 2 * max_len), st.integers(max_len, 5 * max_len)))
    cfg = base_config(max_len, kv_slots, 0)
    caching = draw(st.booleans()) if prefix_caching is None else prefix_caching
    B = draw(st.sampled_from([b for b in BLOCK_SIZES if b <= kv_slots]))
    cfg["allocator"] = {"kind": "paged", "block_size": B, "prefix_caching": caching}
    max_num_seqs = draw(st.sampled_from([1, 2, 3, 4, 8, 256, 256]))
    budget = draw(st.sampled_from([1, 7, 16, 32, 50, 128, 512, 2048]))
    cfg["scheduler"] = {
        "policy": "vllm-v1",
        "max_num_seqs": max_num_seqs,
        "max_num_batched_tokens": max(budget, max_num_seqs),  # a decode step fits the budget
        "long_prefill_token_threshold": draw(st.sampled_from([0, 0, 0, 5, 16, 40])),
        "max_num_partial_prefills": draw(st.sampled_from([None, None, 1, 2])),
        "reserve_full_isl": draw(st.booleans()),
        "router": draw(st.sampled_from(["round_robin", "least_outstanding_tokens"])),
    }
    cfg["engine"] = {"macro_steps": draw(st.sampled_from([True, True, True, False]))}
    return draw_replicas_window_seed(draw, cfg)


@st.composite
def token_prompts(draw, count: int, max_prompt: int) -> list[tuple[int, ...]]:
    """Prompts as token ids: a few bases that prompts start with (cut anywhere, so shared
    prefixes end mid-block), then their own tokens from a small vocabulary."""
    bases = draw(
        st.lists(
            st.lists(st.integers(0, 3), min_size=max_prompt, max_size=max_prompt),
            min_size=1,
            max_size=3,
        )
    )
    prompts = []
    for _ in range(count):
        shared = draw(st.integers(0, max_prompt))
        base = draw(st.sampled_from(bases))[:shared]
        own = draw(st.lists(st.integers(0, 3), min_size=0, max_size=max_prompt - shared))
        prompts.append(tuple(base + own) or (0,))
    return prompts


def follow_up(draw, earlier: list[Request], own: tuple[int, ...], limit: int) -> tuple[int, ...]:
    """A next turn: the prompt and answer (``output_token_ids``) of one earlier request that
    knows its answer, then ``own`` tokens, cut to ``limit`` tokens; ``own`` alone when no
    earlier request knows its answer."""
    answered = [r for r in earlier if r.output_token_ids is not None]
    if not answered:
        return own
    r = draw(st.sampled_from(answered))
    return (r.token_ids + r.output_token_ids + own)[:max(limit, 1)]


@st.composite
def v1_workloads(draw, max_len: int, max_count: int = 12) -> list[Request]:
    """One-sequence requests (a rare n > 1 or beam request: rejected under v1) with shared
    prefixes: prefix ids, Mooncake hash ids, or real token ids. Requests with token ids
    often know their answer (``output_token_ids``), and a later one often resends an
    earlier one's prompt + answer (a conversation's next turn)."""
    count = draw(st.integers(1, max_count))
    sharing = draw(st.sampled_from(["none", "prefix", "hash", "tokens", "tokens", "mixed"]))
    tokens = draw(token_prompts(count, max_len // 2)) if sharing == "tokens" else []
    requests, t = [], 0.0
    for i in range(count):
        mixed = ["none", "prefix", "hash", "prefix", "hash", "samples"]
        t, kind, prompt = next_request(draw, t, sharing, mixed, max_len)
        output = draw(st.integers(1, max_len // 2))
        extra: dict = {"n": 2} if kind == "samples" else shared_prefix(draw, kind, prompt, max_len)
        if kind == "tokens":
            ids = tokens[i]
            if draw(st.booleans()):  # a next turn (its prompt + output fits the model)
                ids = follow_up(draw, requests, ids, max_len - output)
            extra["token_ids"] = ids
            prompt = len(ids)
            if draw(st.integers(0, 3)):  # most know their answer
                extra["output_token_ids"] = tuple(
                    draw(st.lists(st.integers(0, 3), min_size=output, max_size=output)))
        requests.append(Request(i, round(t, 6), prompt, output, **extra))
    return requests


@st.composite
def v1_cases(draw, prefix_caching: bool | None = None) -> tuple[dict, list[Request]]:
    cfg = draw(v1_configs(prefix_caching))
    return cfg, draw(v1_workloads(cfg["model"]["context_len_tokens"]))



def draw_replicas_window_seed(draw, cfg: dict) -> dict:
    """1-3 replicas, a busy / saturated / explicit window, the step table on or off, a seed."""
    cfg["hardware"]["num_replicas"] = draw(st.sampled_from([1, 1, 2, 3]))
    return draw_window_and_seed(draw, cfg, starts=(None, 0.05), ends=(0.2, 1.0))


def draw_window_and_seed(draw, cfg: dict, starts: tuple, ends: tuple) -> dict:
    """A busy / saturated / explicit window (start and end drawn from ``starts`` and ``ends``,
    s; an explicit window with neither ends at 0.2 s), the step table on or off, a seed."""
    window = draw(st.sampled_from(["busy", "saturated", "explicit"]))
    if window == "explicit":
        start, end = draw(st.sampled_from(starts)), draw(st.sampled_from(ends))
        if start is None and end is None:
            end = 0.2
        cfg["metrics"] = {"window_start_s": start, "window_end_s": end}
    else:
        cfg["metrics"] = {"window": window}
    cfg["metrics"]["step_table"] = draw(st.booleans())
    cfg["seed"] = draw(st.integers(0, 3))
    return cfg

# --- sglang -------------------------------------------------------------------------------------
@st.composite
def sglang_configs(draw) -> dict:
    """``scheduler.policy: sglang``: every queue order and eviction policy, page sizes 1, 16
    and 64, chunks smaller than a prompt and larger than any, mixed chunks on and off, small
    caches (a request or a few) so the running batch runs out and retracts, 1-3 replicas."""
    max_len = draw(st.sampled_from([128, 256, 512]))
    kv_slots = draw(st.one_of(st.integers(max_len, 2 * max_len), st.integers(max_len, 5 * max_len)))
    cfg = base_config(max_len, kv_slots, 0)
    page = draw(st.sampled_from([p for p in [1, 1, 16, 64] if p <= kv_slots]))
    cfg["allocator"] = {"kind": "paged", "block_size": page}
    max_num_seqs = draw(st.sampled_from([1, 2, 3, 8, 256, 256]))
    cfg["scheduler"] = {
        "policy": "sglang",
        "schedule_policy": draw(st.sampled_from(["lpm", "lpm", "dfs-weight", "fcfs"])),
        # (a chunk below the page size is a config error: chunks are cut to whole pages)
        "chunked_prefill_size": draw(st.sampled_from([c for c in [None, 16, 50, 64, 128, 8192]
                                                      if c is None or c >= page])),
        "enable_mixed_chunk": draw(st.booleans()),
        "schedule_conservativeness": draw(st.sampled_from([1.0, 1.0, 0.3, 2.0])),
        "max_num_seqs": max_num_seqs,
        # (the config asks for a budget of at least max_num_seqs tokens)
        "max_num_batched_tokens": max(draw(st.sampled_from([64, 200, 1024, 16384])), max_num_seqs),
        "router": draw(st.sampled_from(["round_robin", "least_outstanding_tokens"])),
    }
    cfg["allocator"]["eviction_policy"] = draw(st.sampled_from(["lru", "lfu", "fifo", "arc", "priority"]))
    return draw_replicas_window_seed(draw, cfg)


@st.composite
def sglang_cases(draw, max_count: int = 12) -> tuple[dict, list[Request]]:
    """An sglang config and one-sequence requests sharing prefixes (prefix ids, hash ids,
    token ids cut anywhere: not page-aligned)."""
    cfg = draw(sglang_configs())
    return cfg, draw(v1_workloads(cfg["model"]["context_len_tokens"], max_count=max_count))


@st.composite
def sglang_pressure_cases(draw) -> tuple[dict, list[Request]]:
    """sglang under memory pressure: everything arrives at once with long outputs into a
    cache of a request or two, under a reservation ratio low enough (conservativeness 0.1
    to 0.3) to admit more than fits, so the running batch runs out of slots and retracts."""
    cfg = draw(sglang_configs())
    cfg["model"]["context_len_tokens"] = 256
    cfg["hardware"]["kv_cache_gib"] = draw(st.integers(256, 420)) / SLOTS_PER_GIB
    cfg["allocator"]["block_size"] = min(cfg["allocator"]["block_size"], 16)
    cfg["scheduler"]["schedule_conservativeness"] = draw(st.sampled_from([0.1, 0.2, 0.3]))
    cfg["scheduler"]["max_num_seqs"] = draw(st.sampled_from([3, 8, 256]))
    cfg["scheduler"]["max_num_batched_tokens"] = 1024
    requests = draw(v1_workloads(256, max_count=10))
    requests = [
        Request(r.request_id, 0.0, r.prompt_tokens, max(r.output_tokens, 60), prefix_id=r.prefix_id,
                prefix_tokens=r.prefix_tokens, hash_ids=r.hash_ids,
                hash_block_tokens=r.hash_block_tokens, token_ids=r.token_ids,
                output_token_ids=None if r.output_token_ids is None  # the longer answer: padded
                else r.output_token_ids + (0,) * (max(r.output_tokens, 60) - r.output_tokens))
        for r in requests
    ]
    return cfg, requests
