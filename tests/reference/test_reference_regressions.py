"""Fixed cases where the fast engine must equal the reference: the shipped real traces and
the vLLM paper's experiments at reduced size, plus cases hypothesis once shrunk to.

Reduced size: the first requests of each trace, and (where the step count would make the
reference slow) a smaller KV cache, which also makes requests queue and get preempted.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest
from ref_cases import base_config
from ref_compare import assert_same

from kvsim.simulator.config import ExperimentConfig, load_config
from kvsim.simulator.engine.runner import make_cost_factory
from kvsim.simulator.reference.simulation import simulate
from kvsim.simulator.workload import build_requests
from kvsim.traces import Request

CONFIGS = Path(__file__).resolve().parents[2] / "configs"


def load(name: str, *overrides: str):
    """A shipped config with ``--set``-style overrides, and its workload's requests."""
    cfg, base_dir = load_config(CONFIGS / name, list(overrides))
    requests = list(
        build_requests(
            cfg.workload, base_dir=base_dir, seed=cfg.seed, max_seq_len=cfg.model.context_len
        )
    )
    return cfg, requests


def test_azure_conversation_head_under_memory_pressure():
    """The quickstart's Azure conversation trace, its first 60 requests, on a KV cache of
    4096 slots: requests queue, are preempted and recomputed."""
    cfg, requests = load(
        "quickstart.yaml",
        "workload.window.num_requests=60",
        "hardware.kv_cache_gib=2",
        "metrics.window=saturated",
        "scheduler.max_num_seqs=32",
    )
    assert len(requests) == 60
    result = simulate(cfg, requests)
    assert result.requests["preemptions"].sum() > 0, "the case must exercise preemption"
    assert_same(cfg, requests)



def mooncake_head(*overrides: str):
    """The Mooncake trace's first 100 requests on a 4 GiB KV cache (32,768 slots; longer
    requests are rejected), with ``overrides``."""
    return load("vllm_paper/mooncake_prefix.yaml", "workload.window.num_requests=100", "hardware.kv_cache_gib=4",
                "model.context_len_tokens=32768", *overrides)


def hits_evicts_preempts_and_agrees(cfg, requests) -> None:
    """The case reaches the rules it is for (cache hits, evictions, preemption or retraction),
    and both engines agree on it."""
    result = simulate(cfg, requests)
    assert result.totals.counters["cached_tokens"] > 0, "the case must hit the prefix cache"
    assert sum(a.evictions for a in result.allocators) > 0, "the case must evict cached blocks"
    assert result.requests["preemptions"].sum() > 0, "the case must preempt (or retract)"
    assert_same(cfg, requests)


def test_mooncake_synthetic_head_with_prefix_caching():
    """The Mooncake trace's first 100 requests (hash ids of 512-token blocks, prompts up to
    ~40K tokens) with prefix caching on a 4 GiB KV cache (32,768 slots; longer requests are
    rejected), where cached blocks are hit, revived and evicted, and a group is preempted."""
    cfg, requests = mooncake_head()
    result = simulate(cfg, requests)
    assert result.totals.counters["cached_tokens"] > 0, "the case must hit the prefix cache"
    assert sum(a.evictions for a in result.allocators) > 0, "the case must evict cached blocks"
    assert_same(cfg, requests)


@pytest.mark.parametrize("preset", ["orca-max", "orca-pow2", "orca-oracle", None])
def test_fig2_memory_breakdown_reduced(preset):
    """Fig. 2's systems (OPT-13B, 12 GiB of KV, ShareGPT-like, 3 req/s, saturated window),
    the first 40 requests."""
    kind = (
        ["allocator.kind=paged"]
        if preset is None
        else ["allocator.kind=contiguous", f"allocator.preset={preset}"]
    )
    cfg, requests = load(
        "vllm_paper/opt13b_sharegpt.yaml",
        "workload.arrivals.rate=3.0",
        "metrics.window=saturated",
        "workload.num_requests=40",
        *kind,
    )
    assert_same(cfg, requests)


@pytest.mark.parametrize("mode", ["swap", "recompute"])
@pytest.mark.parametrize("block_size", [1, 16, 256])
def test_fig19_swap_recompute_reduced(mode, block_size):
    """Fig. 19b's grid point (OPT-13B, 2.2 req/s, 8 GiB of swap), the first 30 requests on
    a 2 GiB KV cache so that groups are preempted."""
    cfg, requests = load(
        "vllm_paper/opt13b_sharegpt.yaml",
        "workload.arrivals.rate=2.2",
        "hardware.swap_space_gib=8",
        f"preemption.mode={mode}",
        f"allocator.block_size={block_size}",
        "workload.num_requests=30",
        "hardware.kv_cache_gib=2",
    )
    result = simulate(cfg, requests)
    assert result.requests["preemptions"].sum() > 0, "the case must exercise preemption"
    assert_same(cfg, requests)


def test_profiled_cost_model_under_memory_pressure():
    """The piecewise-affine profiled cost model (decode runs end where its segments end),
    ShareGPT-like requests on a 1 GiB cache: 60 requests, preempted and recomputed."""
    cfg = ExperimentConfig.model_validate(
        {
            "name": "profiled",
            "model": {"name": "llama-3.1-8b", "context_len_tokens": 4096},
            "hardware": {"gpu": "rtx4090", "kv_cache_gib": 1.0},
            "workload": {
                "arrivals": {"kind": "poisson", "rate": 6.0},
                "lengths": {"kind": "preset", "name": "sharegpt-paper"},
                "num_requests": 60,
            },
            "scheduler": {"max_num_batched_tokens": 4096},
            "cost_model": {"kind": "profiled", "profile": "rtx4090-llama-3.1-8b"},
        }
    )
    requests = list(build_requests(cfg.workload, base_dir=CONFIGS, seed=0, max_seq_len=4096))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # short prompts fall below the profile's grid: extrapolated
        result = simulate(cfg, requests, make_cost_factory(cfg, CONFIGS))
        assert result.requests["preemptions"].sum() > 0, "the case must exercise preemption"
        assert_same(cfg, requests)


def test_prefix_cache_evicts_the_least_recently_released_block():
    """Two prefixes are cached and released (p0 first), a unique prompt needs one more
    block than is free, so one cached block is evicted: p0's, the least recently released.
    A later p0 request misses, a p1 request hits: both engines must agree on which."""
    cfg = base_config(64, 64, 0)  # 4 blocks of 16 slots
    cfg["allocator"] = {"kind": "paged", "block_size": 16, "prefix_caching": True, "watermark": 0.0}
    cfg["scheduler"] = {"max_num_seqs": 8, "max_num_batched_tokens": 64}
    requests = [
        Request(0, 0.0, 16, 1, prefix_id="p0", prefix_tokens=16),  # 1 block, cached
        Request(1, 0.5, 16, 1, prefix_id="p1", prefix_tokens=16),
        Request(2, 1.0, 40, 1),  # 3 blocks: 2 free + evict one cached
        Request(3, 1.5, 17, 1, prefix_id="p1", prefix_tokens=16),
        Request(4, 2.0, 17, 1, prefix_id="p0", prefix_tokens=16),
    ]
    result = simulate(ExperimentConfig.model_validate(cfg), requests)
    assert result.requests["cached_prompt_tokens"].tolist() == [0, 0, 0, 16, 0]
    assert_same(cfg, requests)


@pytest.mark.parametrize("placement", ["first_fit", "best_fit"])
def test_placement_decides_external_fragmentation(placement):
    """400 slots, exact (oracle) regions. Five requests fill the space; the two short ones
    (120 and 60 slots) finish at once, leaving holes of 120 and 60. A 60-slot region
    arrives: best fit puts it in the 60 hole, first fit carves the 120 one. A 120-slot
    region follows: best fit places it; first fit has 120 free slots in two holes of 60,
    so it waits although the free total would hold it (external fragmentation)."""
    cfg = base_config(256, 400, 0)
    cfg["allocator"] = {
        "kind": "contiguous",
        "placement": placement,
        "reservation": "oracle",
        "watermark": 0.0,
    }
    requests = [
        Request(0, 0.0, 10, 61),
        Request(1, 0.0, 119, 2),
        Request(2, 0.0, 10, 61),
        Request(3, 0.0, 59, 2),
        Request(4, 0.0, 20, 61),  # regions 70, 120, 70, 60, 80
        Request(5, 0.1, 30, 31),
        Request(6, 0.11, 100, 21),
    ]  # regions 60, 120
    result = simulate(ExperimentConfig.model_validate(cfg), requests)
    external = result.totals.measured["external_frag"]
    waited = result.requests.loc[6, "scheduled_s"] - 0.11
    if placement == "best_fit":
        assert external == 0 and waited < 0.02
    else:
        assert external > 0 and waited > 0.1
    assert_same(cfg, requests)


def test_a_group_that_preempts_itself_is_swapped_back_or_aborted_not_stalled():
    """A lone beam group on a 4-block cache: after a beam forks into a dead one's place,
    both beams share a partly filled last block and each counts a copy, but one block is
    free, so the group preempts (swaps out) itself. The next step must try to swap it back
    (here it can never fit again with a slot per beam: aborted), not end the run with
    'can never be scheduled' (the fast engine once raised SimulationStalled here)."""
    cfg = base_config(256, 256, 512)
    cfg["allocator"] = {"kind": "paged", "block_size": 64, "watermark": 0.0}
    cfg["scheduler"] = {"max_num_seqs": 256, "max_num_batched_tokens": 1024}
    cfg["preemption"] = {"mode": "swap"}
    requests = [Request(0, 0.0, 128, 60, beam_width=2)]
    result = simulate(ExperimentConfig.model_validate(cfg), requests)
    row = result.requests.iloc[0]
    assert (row["status"], row["preemptions"], row["reason"]) == (
        "aborted",
        1,
        "swapped-out group can no longer fit in GPU memory",
    )
    assert_same(cfg, requests)


@pytest.mark.parametrize(("block_size", "mode"), [(1, "recompute"), (16, "swap"), (256, "auto")])
def test_calibrated_cost_model_with_samples_under_pressure(block_size, mode):
    """The calibrated cost model (the shipped example A100 profile): 40 requests, a third
    of them with two parallel samples, on 1,500 slots: preemption, swap traffic whose time
    depends on the block size, and copy-on-write of the samples' last prompt blocks."""
    cfg = base_config(512, 1500, 1024)
    cfg["allocator"] = {"kind": "paged", "block_size": block_size}
    cfg["preemption"] = {"mode": mode}
    cfg["cost_model"] = {"kind": "calibrated", "profile": "example-a100-80gb"}
    lengths = np.random.default_rng(block_size).integers(10, 250, size=(40, 3))
    requests = [Request(i, 0.02 * i, int(p), int(o), n=2 if k == 0 else 1)
                for i, (p, o, k) in enumerate(lengths % [1000, 1000, 3])]
    cfg_model = ExperimentConfig.model_validate(cfg)
    result = simulate(cfg_model, requests, make_cost_factory(cfg_model, CONFIGS))
    assert result.requests["preemptions"].sum() > 0, "the case must exercise preemption"
    assert_same(cfg, requests)


def azure_head(kv_cache_gib: int, policy: str, *overrides: str):
    """The quickstart's first 60 requests (its Azure conversation head) under ``policy`` on a
    cache of ``kv_cache_gib`` GiB, 32 running at most, recompute preemption, measured over
    the saturated window; then ``overrides``."""
    return load("quickstart.yaml", "workload.window.num_requests=60",
                f"hardware.kv_cache_gib={kv_cache_gib}",
                "metrics.window=saturated", "scheduler.max_num_seqs=32",
                f"scheduler.policy={policy}",
                "preemption.mode=recompute", *overrides)


def preempts_mixes_and_agrees(cfg, requests, preempting: str) -> None:
    """The case preempts (else fail with ``preempting``) and mixes prefill chunks with
    decodes in a step, and the fast engine equals the reference on it."""
    result = simulate(cfg, requests)
    assert result.requests["preemptions"].sum() > 0, preempting
    mixed = (result.steps["prefill_tokens"] > 0) & (result.steps["decode_tokens"] > 0)
    assert mixed.any(), "the case must mix prefill chunks with decodes"
    assert_same(cfg, requests)


# --- vllm-v1 -------------------------------------------------------------------------------------
def test_v1_azure_conversation_head_chunked_under_memory_pressure():
    """The quickstart's Azure conversation head under vllm-v1: a 512-token budget and a
    256-token long-prefill threshold chunk the long prompts into mixed steps, and a 2 GiB
    cache makes running requests preempt (recompute) the most recently admitted."""
    cfg, requests = azure_head(2, "vllm-v1", "scheduler.max_num_batched_tokens=512",
                               "scheduler.long_prefill_token_threshold=256")
    preempts_mixes_and_agrees(cfg, requests, "the case must exercise preemption")


def test_v1_mooncake_head_with_prefix_caching():
    """The Mooncake head (hash ids of 512-token blocks) under vllm-v1 with prefix caching on a
    4 GiB cache: prompts up to ~30K tokens chunked into a 2048-token budget, cache hits,
    lazy evictions from the free queue, and preemptions."""
    cfg, requests = mooncake_head(
        "scheduler.policy=vllm-v1",
        "preemption.mode=recompute",
        "scheduler.max_num_batched_tokens=2048",
    )
    hits_evicts_preempts_and_agrees(cfg, requests)


def test_v1_a_finish_ends_a_decode_run_when_a_request_waits_for_a_seat():
    """max_num_seqs 2: r0 and r1 decode while r2 waits for a seat. r0 finishes at the end of
    step 2, so step 3 admits r2 next to r1's decode: r2 is scheduled at step 3's start and
    finishes with r1 at its end. (The fast engine once ran r1's remaining decodes as one
    closed-form run and admitted r2 only after it.)"""
    cfg = base_config(128, 128, 0)
    cfg["allocator"] = {"kind": "paged", "block_size": 1}
    cfg["scheduler"] = {"policy": "vllm-v1", "max_num_seqs": 2, "max_num_batched_tokens": 64}
    requests = [Request(0, 0.0, 1, 3), Request(1, 0.0, 1, 4), Request(2, 0.0, 1, 1)]
    result = simulate(ExperimentConfig.model_validate(cfg), requests)
    steps = result.steps
    r = result.requests.set_index("request_id")
    assert r.loc[2, "scheduled_s"] == steps["start_s"].iloc[3]
    assert r.loc[2, "finish_s"] == r.loc[1, "finish_s"] == steps["start_s"].iloc[3] + steps[
        "duration_s"
    ].iloc[3]
    assert_same(cfg, requests)


def test_v1_recompute_tokens_are_counted_chunk_by_chunk():
    """A 71-token request on a 1-slot-block cache with a 3-token budget is preempted and
    catches up over many 3-token chunks; each step counts the recomputed tokens it computes
    (never more than its prefill tokens), so the recompute share of a step's time is at
    most the whole step. Counting them all at re-admission gave one 3-token step 93
    recomputed tokens: 31 times its length. (Shrunk by hypothesis.)"""
    cfg = base_config(256, 256, 0)
    cfg["allocator"] = {"kind": "paged", "block_size": 1}
    cfg["scheduler"] = {
        "policy": "vllm-v1",
        "max_num_seqs": 3,
        "max_num_batched_tokens": 3,
        "reserve_full_isl": False,
    }
    requests = [Request(0, 0.0, 71, 94), Request(1, 0.0, 1, 1), Request(2, 0.0, 1, 1),
                Request(3, 0.0, 1, 93)]
    result = simulate(ExperimentConfig.model_validate(cfg), requests)
    assert result.requests["preemptions"].sum() > 0, "the case must exercise preemption"
    steps = result.steps
    assert (steps["recompute_tokens"] <= steps["prefill_tokens"]).all()
    assert steps["recompute_tokens"].sum() > steps["prefill_tokens"].max()
    assert_same(cfg, requests)


# --- sglang ----------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "overrides",
    [
        ("allocator.block_size=1",),  # SGLang's defaults: page 1, lpm, lru, chunks of 8192
        (
            "allocator.block_size=16",
            "scheduler.schedule_policy=dfs-weight",
            "allocator.eviction_policy=lfu",
            "scheduler.enable_mixed_chunk=true",
            "scheduler.chunked_prefill_size=2048",
        ),
    ],
)
def test_sglang_mooncake_head_radix_cache(overrides):
    """The Mooncake head (hash ids of 512-token blocks, prompts up to ~30K tokens) under
    sglang on a 4 GiB cache (32,768 slots): the radix tree is hit and evicted, long prompts
    are chunked, and running requests are retracted."""
    cfg, requests = mooncake_head(
        "scheduler.policy=sglang",
        "preemption.mode=recompute",
        "allocator.watermark=0",
        *overrides,
    )
    hits_evicts_preempts_and_agrees(cfg, requests)


def test_sglang_azure_conversation_head_mixed_under_memory_pressure():
    """The quickstart's Azure conversation head under sglang on a 1 GiB cache, a reservation
    ratio of 0.07 (conservativeness 0.1) that admits more than fits, dfs-weight order and
    512-token chunks mixed with the running batch's decodes: a request is retracted."""
    cfg, requests = azure_head(1, "sglang", "allocator.watermark=0",
                               "scheduler.schedule_conservativeness=0.1",
                               "scheduler.enable_mixed_chunk=true",
                               "scheduler.chunked_prefill_size=512",
                               "scheduler.schedule_policy=dfs-weight")
    preempts_mixes_and_agrees(cfg, requests, "the case must retract")


def test_sglang_lpm_falls_back_to_arrival_order_while_more_than_128_wait():
    """140 token-id requests at once (three 32-36-token shared heads, then their own tokens)
    and 20 more later, 16 running at most: for the first steps more than 128 wait and lpm
    keeps arrival order; once fewer wait it sorts by cached prefix again (a reference that
    always sorts admits other requests first: caught in the comparison)."""
    cfg = base_config(512, 1200, 0)
    cfg["scheduler"] = {"policy": "sglang", "max_num_seqs": 16, "max_num_batched_tokens": 512,
                        "chunked_prefill_size": 128}
    requests = []
    for i in range(160):
        head, own = 32 + i % 5, 8 + (i * 37) % 90 - i % 5
        tokens = (i % 3,) * head + (7 + (i * 11) % 50,) * own
        requests.append(Request(i, 0.0 if i < 140 else 0.5, len(tokens), 8 + (i * 13) % 40,
                                token_ids=tokens))
    result = simulate(ExperimentConfig.model_validate(cfg), requests)
    assert result.steps["waiting"].max() > 128, "the queue must exceed lpm's 128"
    assert result.totals.counters["cached_tokens"] > 0, "the case must hit the radix cache"
    assert_same(cfg, requests)


def test_a_swapped_group_aborted_at_swap_in_unblocks_the_waiting_head():
    """Found by a long differential run (vllm-v0, block 128, four blocks of KV): request 3
    (n=2) is swapped out, request 2 is preempted for recomputation and waits behind it.
    When request 3 can no longer fit, the swap-in aborts it during a decode step; the
    waiting request 2 is admitted at the very next step. The fast engine planned that
    step as the first of a two-iteration run (the head still read as blocked by the
    swapped queue, now empty), so requests 1 and 2 finished in each other's order."""
    cfg = base_config(256, 512, 1024)
    cfg["allocator"] = {"kind": "paged", "block_size": 128, "watermark": 0.0}
    cfg["scheduler"] = {"max_num_seqs": 256, "max_num_batched_tokens": 1024}
    cfg["preemption"] = {"mode": "recompute"}
    requests = [Request(i, 0.0, p, o, n=n) for i, (p, o, n) in
                enumerate([(1, 3, 2), (111, 21, 1), (1, 2, 1), (128, 17, 2)])]
    result = simulate(ExperimentConfig.model_validate(cfg), requests)
    assert result.requests.set_index("request_id").loc[3, "status"] == "aborted"
    assert result.requests["preemptions"].sum() >= 2
    assert_same(cfg, requests)


def test_v1_requests_finishing_in_one_step_free_their_blocks_in_running_order():
    """Found by a randomized differential run (vllm-v1, prefix caching, a write-back CPU
    tier): request 7 is preempted and admitted again, then finishes in the same step as
    request 9, which has run since before 7's second admission. vLLM v1 frees a step's
    finished requests in its scheduling order (running requests as admitted: 9, then 7),
    so 9's blocks join the free queue first and are taken first. The fast engine freed by
    arrival and id (7, then 9), took a cached block where the reference took a free one,
    and counted one GPU eviction more (and stored one block more in the CPU tier)."""
    cfg = {
        "model": {"name": "llama-2-7b", "context_len_tokens": 128},
        "hardware": {"gpu": "a100-80gb", "kv_cache_gib": 0.0751953125, "swap_space_gib": 0.0},
        "workload": {"arrivals": {"kind": "poisson", "rate": 1.0}, "num_requests": 1,
                     "lengths": {"kind": "fixed", "prompt_tokens": 1, "output_tokens": 1}},
        "allocator": {"kind": "paged", "block_size": 16, "prefix_caching": True, "tiers": [
            {"name": "cpu", "capacity_gib": 0.0078125, "link": {"bandwidth_gb_s": 4.0, "latency_s": 0.01},
             "write_policy": "write-back"},
            {"name": "disk", "capacity_gib": 0.0, "link": {"bandwidth_gb_s": 0.25, "latency_s": 0.0},
             "write_policy": "write-through"}]},
        "scheduler": {"policy": "vllm-v1", "max_num_seqs": 8, "max_num_batched_tokens": 32},
        "seed": 0,
    }
    shapes = {5: (64, 23, None), 7: (51, 15, (0, 1, 2, 3)), 9: (17, 3, (0, 1)),
              11: (17, 18, (0, 1)), 13: (17, 17, (10, 11))}
    requests = []
    for i in range(14):
        prompt, output, hashes = shapes.get(i, (17, 1, (0, 1)))
        if i == 5:  # a shared-prefix request, not hash-identified
            requests.append(Request(i, 0.0, prompt, output, prefix_id="p0", prefix_tokens=16))
        else:
            requests.append(Request(i, 0.011 if i == 13 else 0.0, prompt, output,
                                    hash_ids=hashes, hash_block_tokens=16))
    result = simulate(ExperimentConfig.model_validate(cfg), requests)
    assert result.requests.set_index("request_id").loc[7, "preemptions"] > 0
    assert_same(cfg, requests)
