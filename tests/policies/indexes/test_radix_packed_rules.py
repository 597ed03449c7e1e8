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
