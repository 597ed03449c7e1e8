"""The radix cache's packed token path (``policies/indexes/radix_cache.py``: ``packed_tokens``,
``_times4``, ``_range4``, the tree's ``unpack``): a request's tokens held as one int64 array
while every request's can be, the same values as ``request_tokens``, and tuples from the
first request that cannot be packed on. Written for the survivors of the module's mutation
campaign (mutation/README.md). Tokens are tagged ints, ``value * 4 + kind`` (0 real token id,
1 hash block, 3 request-unique), so the largest value that fits is 2**63 - 1 = ``_INT64_MAX``.
"""

from __future__ import annotations

from array import array

import numpy as np
import pytest

from kvsim.policies.indexes.radix_cache import (
    _INT64_MAX,
    RadixCacheAllocator,
    _range4,
    _times4,
    packed_tokens,
    request_tokens,
)
from kvsim.traces import Request

LIMIT = _INT64_MAX // 4  # 2**61 - 1: the largest real token id whose tag fits


def same(r: Request, out: int) -> bool:
    packed = packed_tokens(r, out)
    return isinstance(packed, array) and packed.typecode == "q" and tuple(packed) == request_tokens(r, out)


def test_real_token_ids_up_to_the_int64_limit_pack():
    """Token ids +-(2**61 - 1) tag to +-(2**63 - 4): they fit; 2**61 and -2**61 do not (None,
    the scheduler keeps tuples)."""
    assert LIMIT == 2**61 - 1
    assert same(Request(1, 0.0, 3, 1, token_ids=(LIMIT, 0, -LIMIT)), 1)
    assert tuple(packed_tokens(Request(1, 0.0, 2, 0, token_ids=(LIMIT, -LIMIT)), 0)) == (LIMIT * 4, -LIMIT * 4)
    assert packed_tokens(Request(1, 0.0, 2, 1, token_ids=(LIMIT + 1, 0)), 1) is None
    assert packed_tokens(Request(1, 0.0, 2, 1, token_ids=(0, -LIMIT - 1)), 1) is None
    assert packed_tokens(Request(1, 0.0, 2, 2, output_token_ids=(5, LIMIT + 1), token_ids=(1, 2)), 2) is None


def test_ids_that_are_not_flat_integers_do_not_pack():
    """Float ids, or ids given as rows, are no token ids: None (``request_tokens`` would still
    tag them, but the array path refuses them)."""
    assert packed_tokens(Request(1, 0.0, 2, 1, token_ids=(1.0, 2.0)), 1) is None
    assert packed_tokens(Request(1, 0.0, 2, 1, token_ids=((1, 2), (3, 4))), 1) is None
    assert packed_tokens(Request(1, 0.0, 2, 1, token_ids=(1, 2), output_token_ids=(0.5,)), 1) is None
    assert packed_tokens(Request(1, 0.0, 2, 1, output_token_ids=((1, 2),), token_ids=(1, 2)), 1) is None


def test_an_empty_answer_packs_as_nothing():
    """A request of no output whose known answer is empty (``output_token_ids`` ``()``):
    packed equal to ``request_tokens`` (its prompt). So is an answer used for none of the
    output tokens asked for (0 of them)."""
    r = Request(1, 0.0, 3, 0, token_ids=(7, 8, 9), output_token_ids=())
    assert same(r, 0) and tuple(packed_tokens(r, 0)) == (28, 32, 36)
    assert same(Request(2, 0.0, 3, 2, token_ids=(7, 8, 9), output_token_ids=(1, 2)), 0)
    assert _times4(()).dtype == np.int64 and len(_times4(())) == 0
    assert _times4([]).dtype == np.int64


def test_hash_blocks_pack_up_to_the_int64_limit():
    """Hash block h's token j is (h x 512 + j) x 4 + 1. Block 2**52 - 1 ends at token 2**61 - 1:
    (2**61 - 1) x 4 + 1 = 2**63 - 3 fits; block 2**52 starts at 2**61: it does not. A negative
    hash id does not pack either (the range's start is negative)."""
    ok = Request(1, 0.0, 512, 1, hash_ids=(2**52 - 1,), hash_block_tokens=512)
    assert same(ok, 1) and packed_tokens(ok, 1)[511] == 2**63 - 3
    assert packed_tokens(Request(1, 0.0, 512, 1, hash_ids=(2**52,), hash_block_tokens=512), 1) is None
    assert packed_tokens(Request(1, 0.0, 4, 1, hash_ids=(-1,), hash_block_tokens=512), 1) is None
    # a prompt shorter than its blocks: only its own tokens are named by them
    assert same(Request(3, 0.0, 600, 2, hash_ids=(5, 6, 7), hash_block_tokens=512), 2)


def test_range4_at_the_limit():
    """``_range4(start, stop, kind)``: value x 4 + kind for start <= value < stop. Its last
    value may be exactly 2**63 - 1 (kind 3 at 2**61 - 1), not one more; an empty range
    (stop <= start) is empty, whatever start is."""
    top = _range4(2**61 - 2, 2**61, 3)
    assert top.dtype == np.int64 and top.tolist() == [2**63 - 5, 2**63 - 1]
    with pytest.raises(OverflowError):
        _range4(2**61 - 1, 2**61 + 1, 3)
    with pytest.raises(OverflowError):
        _range4(-1, 2, 0)
    assert _range4(5, 5, 3).tolist() == [] and _range4(7, 5, 3).tolist() == []
    assert _range4(-3, -3, 1).tolist() == []
    assert _range4(0, 3, 1).tolist() == [1, 5, 9]


def test_request_ids_up_to_2_21_pack():
    """A request's own token j is ((request id << 40) + j) x 4 + 3: request id 2**21 - 1 fits
    for any j below 2**40, 2**21 does not (its first token is 2**63 + 3)."""
    assert same(Request(2**21 - 1, 0.0, 4, 3), 3)
    assert packed_tokens(Request(2**21 - 1, 0.0, 4, 3), 3)[0] == ((2**21 - 1) << 42) + 3
    assert packed_tokens(Request(2**21, 0.0, 4, 3), 3) is None


def test_a_last_hash_block_of_one_token_still_names_it():
    """A 513-token prompt over blocks of 512: its second block covers 1 token, which is that
    block's (hash 6, token 0: (6 x 512) x 4 + 1), not the request's own."""
    r = Request(3, 0.0, 513, 1, hash_ids=(5, 6), hash_block_tokens=512)
    assert same(r, 1) and packed_tokens(r, 1)[512] == 6 * 512 * 4 + 1


def test_a_prefix_length_without_a_prefix_name_names_nothing():
    """``prefix_tokens`` alone (no ``prefix_id``) shares nothing: the prompt is the request's
    own tokens, which pack."""
    assert same(Request(1, 0.0, 4, 1, prefix_tokens=2), 1)


def _compute(alloc: RadixCacheAllocator, rid: int, tokens, n: int) -> int:
    """A request computes its ``n`` tokens and finishes (they stay cached); returns its hit."""
    hit = alloc.open(rid, tokens, n, n)
    assert alloc.extend(rid, n - hit)
    alloc.cache_unfinished(rid)
    alloc.finish(rid)
    return hit


def test_unpacking_turns_every_key_and_held_sequence_into_a_tuple_with_the_same_hits():
    """Request 0's 6 tokens are cached packed; request 1 (packed) is running when the first
    request that cannot pack arrives (the scheduler then calls ``unpack``): the tree's keys
    and the running request's sequence become tuples, and both still match as before: request
    1 finishes into the tree, and request 0's and 1's tokens, asked as tuples, hit in full."""
    alloc = RadixCacheAllocator(64, 1)
    r0, r1 = (Request(i, 0.0, 6, 1, token_ids=tuple(range(10 * i, 10 * i + 6))) for i in (0, 1))
    assert _compute(alloc, 0, packed_tokens(r0, 1), 6) == 0
    assert alloc.open(1, packed_tokens(r1, 1), 6, 6) == 0 and alloc.extend(1, 6)
    alloc.unpack()
    assert all(type(n.key) is tuple for n in alloc.tree.nodes()) and type(alloc.held[1].tokens) is tuple
    alloc.cache_unfinished(1)
    alloc.finish(1)
    alloc.check()
    assert alloc.tree.match(request_tokens(r0, 1), 6)[0] == 6 and alloc.tree.match(request_tokens(r1, 1), 6)[0] == 6


def test_arc_remembers_a_node_evicted_packed_by_its_tokens_as_a_tuple():
    """ARC over 8 slots. Request 0's 6 tokens are cached packed; request 1's 6 evict them
    (a ghost in B1, remembered as (6, their tagged values)). After ``unpack``, request 0's
    tokens come back as a tuple: the same ghost, a hit in B1, so ARC's target p grows to 1."""
    alloc = RadixCacheAllocator(8, 1, "arc")
    r0, r1 = (Request(i, 0.0, 6, 1, token_ids=tuple(range(10 * i + 1, 10 * i + 7))) for i in (0, 1))
    _compute(alloc, 0, packed_tokens(r0, 1), 6)
    _compute(alloc, 1, packed_tokens(r1, 1), 6)
    arc = alloc.tree._arc
    assert list(arc.ghosts[1]) == [(6, (4, 8, 12, 16, 20, 24))] and arc.p == 0
    alloc.unpack()
    assert _compute(alloc, 2, request_tokens(r0, 1), 6) == 0 and arc.p == 1


def test_times4_and_range4_refuse_what_does_not_pack_by_name():
    """``packed_tokens`` turns each refusal into None (the scheduler keeps tuples); called
    alone, ``_times4`` and ``_range4`` say why: not a flat row of integers, or a tag past
    int64."""
    for ids in ((1.5, 2.0), ((1, 2), (3, 4))):
        with pytest.raises(TypeError) as e:
            _times4(ids)
        assert str(e.value) == "token ids are not integers"
    for ids in ((LIMIT + 1,), (-LIMIT - 1, 0)):
        with pytest.raises(OverflowError) as e:
            _times4(ids)
        assert str(e.value) == "token id past int64 / 4"
    for start, stop in ((2**61 - 1, 2**61 + 1), (-1, 2)):  # (``_range4``'s words)
        with pytest.raises(OverflowError) as e:
            _range4(start, stop, 3)
        assert str(e.value) == "token past int64"
