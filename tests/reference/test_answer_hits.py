"""A conversation's next turn hits the previous turn's answer (``Request.output_token_ids``).

The engines name a request's generated tokens by its ``output_token_ids`` when it has them
(vLLM v1: ``simulator.decoding.prefix_contents(..., with_output=True)`` and the reference's
``sequence_block_names``; SGLang: ``request_tokens`` in ``policies.indexes.radix_cache`` and
``simulator.reference.sglang``), so a later prompt that resends prompt + answer hits both.
Hand-worked cases first (reference and fast engine, each against the derivation), then the
differential test on drawn cases where later prompts resend earlier prompts + answers, and
a check that those cases do hit answers.
"""

from __future__ import annotations

import random
from pathlib import Path

from hypothesis import HealthCheck, Phase, given, note, settings
from hypothesis import strategies as st
from ref_cases import base_config, sglang_cases, v1_cases
from ref_compare import assert_same, case_source, run_fast

from kvsim.simulator.config import ExperimentConfig
from kvsim.simulator.engine.runner import make_cost_factory
from kvsim.simulator.reference.simulation import simulate
from kvsim.simulator.reference.vllm import ReferenceStalled
from kvsim.traces import Request

PROMPT_1, ANSWER_1, USER_2 = 40, 30, 10


def two_turns(answer_known: bool) -> list[Request]:
    """Turn 1: a 40-token prompt and a 30-token answer. Turn 2, 100 s later (turn 1 long
    finished): turn 1's prompt, its answer and 10 new tokens (80 tokens)."""
    rng = random.Random(7)
    prompt = tuple(rng.randrange(1000) for _ in range(PROMPT_1))
    answer = tuple(rng.randrange(1000) for _ in range(ANSWER_1))
    user = tuple(rng.randrange(1000) for _ in range(USER_2))
    turn_2 = prompt + answer + user
    return [
        Request(0, 0.0, PROMPT_1, ANSWER_1, token_ids=prompt,
                output_token_ids=answer if answer_known else None),
        Request(1, 100.0, len(turn_2), 5, token_ids=turn_2),
    ]


def config(policy: str, block_size: int) -> dict:
    cfg = base_config(512, 4096, 0)  # a cache far larger than both turns: nothing is evicted
    cfg["allocator"] = {"kind": "paged", "block_size": block_size, "prefix_caching": True}
    cfg["scheduler"] = {"policy": policy, "max_num_seqs": 4, "max_num_batched_tokens": 2048}
    if policy == "sglang":
        del cfg["allocator"]["prefix_caching"]  # (the radix cache is always on)
    return cfg


def turn_2_hits(cfg: dict, requests: list[Request]) -> tuple[int, int]:
    """Turn 2's cached prompt tokens in the reference and in the fast engine."""
    c = ExperimentConfig.model_validate(cfg)
    ref = simulate(c, requests, make_cost_factory(c, Path(".")))
    fast = run_fast(c, requests).request_rows.frame()
    return int(ref.requests["cached_prompt_tokens"].iloc[1]), int(fast["cached_prompt_tokens"].iloc[1])


def test_vllm_v1_turn_2_hits_turn_1s_answer_at_block_16():
    """vLLM v1, 16-token blocks. Turn 1 computes KV for its 40 prompt tokens and the first
    29 of its 30 answer tokens (the last one is sampled, never fed back): 69 tokens, so 4
    full blocks (64 tokens) are cached when it finishes: blocks 0-1 = prompt[0:32], block 2
    = prompt[32:40] + answer[0:8], block 3 = answer[8:24]. Turn 2 (80 tokens) looks up at
    most (80 - 1) // 16 = 4 blocks; its first 64 tokens are prompt + answer[0:24], the
    same contents under the same chain: all 4 hit, 64 tokens. Without the answer's ids the
    generated tokens are turn 1's own, so block 2 already differs: 2 blocks, 32 tokens."""
    cfg = config("vllm-v1", 16)
    assert turn_2_hits(cfg, two_turns(answer_known=True)) == (64, 64)
    assert turn_2_hits(cfg, two_turns(answer_known=False)) == (32, 32)


def test_sglang_turn_2_hits_turn_1s_answer_at_page_1():
    """SGLang, page 1. Turn 1 finishes and inserts the tokens it holds KV for into the
    tree: its 40 prompt tokens and 29 answer tokens (69). Turn 2 matches at most
    80 - 1 = 79 tokens: its first 69 are exactly those, its 70th is answer[29], which is
    not in the tree: 69 tokens hit. Without the answer's ids, the tree holds turn 1's own
    generated tokens, and the match stops at the end of its prompt: 40."""
    cfg = config("sglang", 1)
    assert turn_2_hits(cfg, two_turns(answer_known=True)) == (69, 69)
    assert turn_2_hits(cfg, two_turns(answer_known=False)) == (40, 40)


def answer_case(case) -> bool:
    """Does a later request's prompt start with an earlier prompt and some of its answer?"""
    _, requests = case
    for i, r in enumerate(requests):
        for e in requests[:i]:
            if r.token_ids and e.output_token_ids and e.token_ids:
                if len(r.token_ids) > len(e.token_ids) and r.token_ids[:len(e.token_ids) + 1] == (
                        e.token_ids + e.output_token_ids[:1]):
                    return True
    return False


# No shrinking: shrinking a failing case of these took over five minutes; the failing case
# is printed as code to paste into a regression test either way.
SETTINGS = dict(max_examples=40, deadline=None, phases=[Phase.generate],
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                       HealthCheck.filter_too_much])


@settings(**SETTINGS)
@given(st.one_of(v1_cases(prefix_caching=True), sglang_cases()).filter(answer_case))
def test_answer_hits_equal_reference(case):
    """vLLM v1 (prefix caching) and SGLang, on drawn cases where a later prompt resends an
    earlier prompt and (part of) its answer: the fast engines equal the reference ones."""
    config, requests = case
    note(case_source(config, requests))
    assert_same(config, requests)


def test_drawn_cases_hit_answers():
    """The drawn cases reach the rule: in some, a request's hit runs past the end of an
    earlier prompt into that request's answer (more cached tokens than with the answers'
    ids dropped). Over the first 60 derandomised answer cases of each engine, measured: 16
    (vLLM v1) and 15 (SGLang) hit more with the answers' ids; with 2 cases, 0 (the bound
    fails, as it must)."""
    better: dict[str, int] = {"vllm-v1": 0, "sglang": 0}

    def cached(cfg: dict, requests: list[Request]) -> int:
        c = ExperimentConfig.model_validate(cfg)
        return int(simulate(c, requests, make_cost_factory(c, Path(".")))
                   .requests["cached_prompt_tokens"].sum())

    def runner(name: str, strategy):
        @settings(max_examples=60, derandomize=True, database=None, deadline=None,
                  suppress_health_check=list(HealthCheck))
        @given(strategy.filter(answer_case))
        def run(case):
            cfg, requests = case
            blind = [Request(r.request_id, r.arrival_time, r.prompt_tokens, r.output_tokens,
                             token_ids=r.token_ids) if r.token_ids is not None else r
                     for r in requests]
            try:
                better[name] += cached(cfg, requests) > cached(cfg, blind)
            except ReferenceStalled:  # a stalled run counts as no gain
                pass

        return run

    for name, strategy in (("vllm-v1", v1_cases(prefix_caching=True)), ("sglang", sglang_cases())):
        runner(name, strategy)()
    assert better["vllm-v1"] >= 5 and better["sglang"] >= 5, better
