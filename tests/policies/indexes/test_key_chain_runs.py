"""The key chain's runs end at branch keys (policies/indexes/key_chain.py): a key created right after
a run, by another parent, is not that run's next key even when its content is the one
sought. Contents here carry no position (real token blocks do not either), so equal
contents meet under different parents, which positional contents never do."""

from __future__ import annotations

from array import array
from unittest.mock import patch

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvsim.policies.indexes import key_chain
from kvsim.policies.indexes.key_chain import FIRST_STRIDE, KeyChain, chain_keys_plain


def test_a_branch_key_after_a_run_is_not_the_run_s_next_key():
    """[a, b] makes keys 0, 1; [a, q] branches at 2 (parent 0). [a, b, q] walks 0, 1 and
    must create 3 for (1, q): key 2 is (0, q), though it comes right after 1 and holds q."""
    chain = KeyChain()
    assert list(chain.keys(["a", "b"])) == [0, 1]
    assert list(chain.keys(["a", "q"])) == [0, 2]
    assert chain.starts == [2]
    assert list(chain.keys(["a", "b", "q"])) == [0, 1, 3]
    assert list(chain.keys(["b", "q"])) == [4, 5]  # a root branch, and its run
    assert list(chain.keys(["b", "q", "q"])) == [4, 5, 6]  # 6 follows 5: no branch
    assert chain.starts == [2, 3, 4] and chain.branches == {(0, "q"): 2, (1, "q"): 3, (-1, "b"): 4}


prompts = st.lists(
    st.tuples(st.integers(0, 10), st.integers(0, 40), st.lists(st.sampled_from("abc"), max_size=30)),
    min_size=1, max_size=30,
)


@pytest.mark.parametrize("stride", [1, 3, FIRST_STRIDE])  # short strides: many doublings
@settings(max_examples=200, deadline=None)
@given(ops=prompts)
def test_keys_without_positions_are_the_block_by_block_keys(stride, ops):
    chain, plain, seen = KeyChain(), {}, [[]]
    with patch.object(key_chain, "FIRST_STRIDE", stride):
        for base, cut, new in ops:
            prompt = seen[base % len(seen)][:cut] + new
            seen.append(prompt)
            assert list(chain.keys(prompt)) == chain_keys_plain(plain, prompt)
        for prompt in seen:
            assert list(chain.keys(prompt)) == chain_keys_plain(plain, prompt)
    assert len(chain) == len(plain)


def test_int_contents_stay_an_int_array_until_another_kind_comes():
    """Hash-id contents (ints, an array from ``prefix_contents``) keep ``content_of`` an int
    array; a list of ints joins it; the first tuple turns it into a list, which an array
    then joins: the keys are the block-by-block walk's throughout."""
    chain, plain = KeyChain(), {}
    runs = [array("q", [5, 6, 7]), [5, 6, 9], array("q", [5, 8]), [("p", "x", 0), 5], [5, 6, 7, 10],
            array("q", [5, 6, 7, 10, 11])]
    for contents in runs:
        assert list(chain.keys(contents)) == chain_keys_plain(plain, list(contents))
        if contents is runs[2]:
            assert isinstance(chain.content_of, array)
    assert isinstance(chain.content_of, list) and len(chain) == len(plain) == 9
    big = KeyChain()
    assert list(big.keys([1 << 70, 2])) == [0, 1] and list(big.keys([1 << 70, 3])) == [0, 2]  # beyond int64
