"""``Request.output_token_ids``: the answer's token ids, checked, cut with the output, filled by
the multi-turn generator, and turned into the same names as the prompt that resends them."""

from __future__ import annotations

import pytest

from kvsim.policies.indexes.radix_cache import request_tokens
from kvsim.simulator.decoding import prefix_contents
from kvsim.simulator.reference.sglang import request_tokens as reference_request_tokens
from kvsim.simulator.reference.vllm import sequence_block_names
from kvsim.traces import Request
from kvsim.traces.multi_turn import MultiTurnSpec, generate_multi_turn
from kvsim.traces.transforms import clip_to_max_len

SPEC = MultiTurnSpec(conversations=20, conversation_rate=2.0, turns=(2, 5), system_prompt_tokens=24,
                     user_tokens=(3, 9), output_tokens=(2, 40), think_time_s=1.0)


def test_each_turn_carries_the_answer_its_next_turn_resends():
    requests = list(generate_multi_turn(SPEC, seed=5))
    assert all(r.output_token_ids is not None and len(r.output_token_ids) == r.output_tokens
               for r in requests)
    followed = 0
    for r in requests:
        sent = r.token_ids + r.output_token_ids
        later = [q for q in requests if q.arrival_time > r.arrival_time and q.token_ids[:len(sent)] == sent]
        # the next turn: prompt + answer + a new user message of 3-9 tokens
        followed += any(3 <= q.prompt_tokens - len(sent) <= 9 for q in later)
    # every turn but each conversation's last is resent, answer included
    assert followed == len(requests) - SPEC.conversations


def test_a_wrong_length_or_a_missing_prompt_is_one_line_naming_the_request():
    with pytest.raises(ValueError, match=r"^request 7: output_token_ids has 2 ids but output_tokens is 3"):
        Request(7, 0.0, 2, 3, token_ids=(1, 2), output_token_ids=(4, 5))
    with pytest.raises(ValueError, match=r"^request 8: output_token_ids needs token_ids"):
        Request(8, 0.0, 2, 2, output_token_ids=(4, 5))
    assert Request(9, 0.0, 2, 2, token_ids=(1, 2), output_token_ids=(4, 5)).output_token_ids == (4, 5)


def test_clipping_cuts_the_answer_with_the_output():
    r = Request(0, 0.0, 4, 6, token_ids=(1, 2, 3, 4), output_token_ids=(5, 6, 7, 8, 9, 10))
    (clipped,) = clip_to_max_len([r], 7)
    assert clipped.output_tokens == 3 and clipped.output_token_ids == (5, 6, 7)


TURN_1 = Request(0, 0.0, 6, 5, token_ids=(1, 2, 3, 4, 5, 6), output_token_ids=(7, 8, 9, 10, 11))
TURN_2 = Request(1, 9.0, 13, 1, token_ids=(1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13))


def test_vllm_block_names_run_over_the_answer_only_when_asked():
    """Block size 4: prompt + answer = 11 tokens, 2 full blocks; the next turn's first two
    blocks hold the same tokens, so the same chained names. v0 (no ``with_output``) names
    the prompt's one full block only; the reference names as the fast engine does."""
    v1 = prefix_contents(TURN_1, 4, with_output=True)
    assert len(v1) == 2 and v1 == prefix_contents(TURN_2, 4)[:2]
    assert prefix_contents(TURN_1, 4) == v1[:1]
    ref = sequence_block_names(TURN_1, 4)
    assert len(ref) == 2 and ref == sequence_block_names(TURN_2, 4)[:2]
    blind = Request(0, 0.0, 6, 5, token_ids=TURN_1.token_ids)
    assert len(prefix_contents(blind, 4, with_output=True)) == 1 == len(sequence_block_names(blind, 4))


def test_radix_names_of_the_answer_are_the_next_prompts():
    """SGLang's token names: turn 1's 11 (prompt + answer) equal turn 2's first 11, in the
    fast engine and the reference alike; without the answer's ids they are turn 1's own."""
    for names in (lambda r: request_tokens(r, r.output_tokens), reference_request_tokens):
        one, two = names(TURN_1), names(TURN_2)
        assert len(one) == 11 and one == two[:11]
        blind = names(Request(0, 0.0, 6, 5, token_ids=TURN_1.token_ids))
        assert blind[:6] == two[:6] and all(a != b for a, b in zip(blind[6:], two[6:11]))
