"""Prefix-cache block identities from a prompt's token ids (simulator.decoding.prefix_contents,
chained by policies.indexes.key_chain as the allocators chain them)."""

from __future__ import annotations

import json
import struct

import pytest

from kvsim.policies.indexes.key_chain import KeyChain, chain_keys_plain
from kvsim.simulator.config import validate_config
from kvsim.simulator.decoding import prefix_contents, token_block_contents
from kvsim.simulator.engine.runner import run_experiment
from kvsim.traces import Request


def request(ids, request_id=0) -> Request:
    return Request(request_id, 0.0, len(ids), 4, token_ids=tuple(ids))


PROMPT = [(7 * i + 3) % 50_000 for i in range(200)]


@pytest.mark.parametrize("block", [1, 16, 64])
def test_same_prefix_same_identities_and_one_changed_token_changes_its_block_and_every_later_one(block):
    chain, plain = KeyChain(), {}

    def identities(ids):
        keys = chain.keys(prefix_contents(request(ids), block))
        assert list(keys) == chain_keys_plain(plain, prefix_contents(request(ids), block))
        return keys

    a = identities(PROMPT)
    assert len(a) == len(PROMPT) // block  # full blocks only
    longer = identities(PROMPT + [1, 2, 3] * block)
    assert longer[: len(a)] == a  # same prefix -> same identities
    changed = list(PROMPT)
    k = 100  # in block 100 // block
    changed[k] += 1
    b = identities(changed)
    j = k // block
    assert b[:j] == a[:j]
    assert all(x != y for x, y in zip(a[j:], b[j:]))  # that block and every later one
    # a content names its block alone: the chain tells equal blocks at two positions apart
    contents = prefix_contents(request(changed), block)
    assert contents[j + 1:] == prefix_contents(request(PROMPT), block)[j + 1:]


def test_equal_tokens_at_two_positions_are_one_content_and_two_identities():
    ids = [5] * 48
    contents = prefix_contents(request(ids), 16)
    assert contents[0] == contents[1] == contents[2]
    assert list(KeyChain().keys(contents)) == [0, 1, 2]


def test_a_partial_last_block_has_no_identity_and_contents_are_the_ids_as_32_bit_ints():
    ids = list(range(40))
    got = token_block_contents(tuple(ids), 16)
    assert len(got) == 2  # 40 tokens: 2 full blocks, 8 tokens left over
    assert prefix_contents(request(ids[:15]), 16) == []
    # the ids as 32-bit integers: exact (no hash to collide) and the same on every run
    assert got == [struct.pack("=16I", *ids[:16]), struct.pack("=16I", *ids[16:32])]
    assert token_block_contents(tuple(ids[:30]), 16, tuple(ids[30:])) == got  # prompt + answer
    assert token_block_contents((), 16) == [] and token_block_contents((1,), 16, (2,)) == []


def test_token_ids_win_over_hash_ids():
    r = Request(0, 0.0, 32, 4, hash_ids=(5,), hash_block_tokens=512, token_ids=tuple(range(32)))
    assert prefix_contents(r, 16) == token_block_contents(tuple(range(32)), 16)


def _run(tmp_path, prompts):
    path = tmp_path / "w.jsonl"
    path.write_text("".join(json.dumps({"input_toks": len(p), "output_toks": 3, "arrival_time_ns": i * 10**9,
                                        "input_tok_ids": p}) + "\n" for i, p in enumerate(prompts)))
    cfg = validate_config({"model": {"name": "llama-2-7b"}, "hardware": {"num_gpu_blocks": 64},
                           "workload": {"trace": {"format": "token-ids", "path": str(path)}},
                           "allocator": {"block_size": 16, "prefix_caching": True}})
    return run_experiment(cfg).requests.sort_values("request_id")["cached_prompt_tokens"].tolist()


def test_a_replay_hits_the_cache_exactly_where_the_tokens_agree(tmp_path):
    base = list(range(1000, 1040))  # 2 full blocks of 16 and 8 tokens
    same_start = base[:32] + [5] * 8
    assert _run(tmp_path, [base, same_start]) == [0, 32]
    differ = [999] + base[1:]  # the first token differs: no block in common
    assert _run(tmp_path, [base, differ]) == [0, 0]
