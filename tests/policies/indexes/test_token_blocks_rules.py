"""The one-line errors of token blocks (policies/indexes/token_blocks.py), word for word: a bad width
and an append to a fixed run say what is allowed."""

from __future__ import annotations

import re

import pytest

from kvsim.policies.indexes.token_blocks import TokenBlocks


def test_a_width_that_does_not_divide_the_data_says_what_is_allowed():
    want = "token blocks of width 4 cannot hold 6 bytes (the width must be >= 1 and divide the data)"
    with pytest.raises(ValueError, match=f"^{re.escape(want)}$"):
        TokenBlocks(b"abcdef", 4)


def test_only_a_growing_store_takes_blocks():
    fixed = TokenBlocks(b"ab", 2)
    with pytest.raises(TypeError, match=r"^only a store \(its data a bytearray\) grows$"):
        fixed += TokenBlocks(b"cd", 2)
    assert fixed.data == b"ab"
