"""Prefix-cache block identities from a prompt's token ids (simulator.decoding.prefix_contents)."""

from __future__ import annotations

import hashlib
import json
import struct

import pytest

from kvsim.simulator.config import validate_config
from kvsim.simulator.decoding import prefix_contents, token_block_identities
from kvsim.simulator.runner import run_experiment
from kvsim.traces import Request


def request(ids, request_id=0) -> Request:
    return Request(request_id, 0.0, len(ids), 4, token_ids=tuple(ids))


PROMPT = [(7 * i + 3) % 50_000 for i in range(200)]


@pytest.mark.parametrize("block", [1, 16, 64])
def test_same_prefix_same_identities_and_one_changed_token_changes_its_block_and_every_later_one(block):
    a = prefix_contents(request(PROMPT), block)
    assert len(a) == len(PROMPT) // block  # full blocks only
    assert len(set(a)) == len(a)  # a chain: equal tokens at two positions are still two blocks
    longer = prefix_contents(request(PROMPT + [1, 2, 3] * block), block)
    assert longer[: len(a)] == a  # same prefix -> same identities
    changed = list(PROMPT)
    k = 100  # in block 100 // block
    changed[k] += 1
    b = prefix_contents(request(changed), block)
    j = k // block
    assert b[:j] == a[:j]
    assert all(x != y for x, y in zip(a[j:], b[j:]))  # that block and every later one


def test_a_partial_last_block_has_no_identity_and_identities_are_stable():
    ids = list(range(40))
    got = token_block_identities(tuple(ids), 16)
    assert len(got) == 2  # 40 tokens: 2 full blocks, 8 tokens left over
    assert prefix_contents(request(ids[:15]), 16) == []
    # blake2b of the ids as little-endian 32-bit integers, chained: the same on every machine and
    # run (Python's str/bytes hash is salted per process).
    first = hashlib.blake2b(struct.pack("<16I", *ids[:16]), digest_size=16).digest()
    second = hashlib.blake2b(first + struct.pack("<16I", *ids[16:32]), digest_size=16).digest()
    assert got == [("t", first), ("t", second)]


def test_token_ids_win_over_hash_ids():
    r = Request(0, 0.0, 32, 4, hash_ids=(5,), hash_block_tokens=512, token_ids=tuple(range(32)))
    assert prefix_contents(r, 16) == token_block_identities(tuple(range(32)), 16)


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
