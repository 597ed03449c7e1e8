"""Token blocks held as one run of bytes (policies/indexes/token_blocks.py) behave as the list of their
blocks, and the key chain keeps them so while every content is one (policies/indexes/key_chain.py)."""

from __future__ import annotations

from array import array

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvsim.policies.indexes.key_chain import KeyChain, chain_keys_plain
from kvsim.policies.indexes.token_blocks import TokenBlocks


def blocks_of(data: bytes, width: int) -> list[bytes]:
    return [data[i:i + width] for i in range(0, len(data), width)]


@settings(max_examples=120, deadline=None)
@given(width=st.integers(1, 5), n=st.integers(0, 9), seed=st.binary(min_size=45, max_size=45),
       start=st.integers(-12, 12), stop=st.integers(-12, 12), step=st.sampled_from([None, 1, 2, -1]))
def test_token_blocks_are_the_list_of_their_blocks(width, n, seed, start, stop, step):
    data = seed[:n * width]
    tb, model = TokenBlocks(data, width), blocks_of(data, width)
    assert len(tb) == len(model) and list(tb) == model and tb == model and tb == tuple(model)
    for j in range(-n, n):
        assert tb[j] == model[j]
    cut = tb[start:stop:step]
    assert list(cut) == model[start:stop:step] and cut == model[start:stop:step]
    assert isinstance(cut, TokenBlocks) and cut.width == width
    assert (tb == model + [b"x" * width]) is False


def test_indexing_beyond_the_blocks_and_bad_widths_fail():
    tb = TokenBlocks(b"abcdef", 2)
    with pytest.raises(IndexError, match="block 3 of 3"):
        tb[3]
    with pytest.raises(IndexError):
        tb[-4]
    with pytest.raises(ValueError, match="token blocks of width 4 cannot hold 6 bytes"):
        TokenBlocks(b"abcdef", 4)
    with pytest.raises(ValueError, match="width 0"):
        TokenBlocks(b"", 0)
    assert tb != TokenBlocks(b"abcdef", 3) and tb == TokenBlocks(bytearray(b"abcdef"), 2)
    assert (tb == "abcdef") is False


def test_a_store_grows_by_blocks_of_its_width_only():
    store = TokenBlocks(bytearray(), 2)
    store += TokenBlocks(b"abcd", 2)
    store += TokenBlocks(b"ef", 2)
    assert list(store) == [b"ab", b"cd", b"ef"] and store[1:] == TokenBlocks(b"cdef", 2)
    with pytest.raises(TypeError, match="only token blocks of width 2"):
        store += TokenBlocks(b"abc", 3)
    fixed = TokenBlocks(b"ab", 2)
    with pytest.raises(TypeError, match="only a store"):
        fixed += TokenBlocks(b"cd", 2)


# Prompts of 2-byte blocks from a small alphabet, cut from earlier ones: branches and runs.
prompts = st.lists(st.tuples(st.integers(0, 8), st.integers(0, 30),
                             st.lists(st.sampled_from([b"aa", b"ab", b"ba"]), max_size=25)),
                   min_size=1, max_size=25)


@settings(max_examples=150, deadline=None)
@given(prompts)
def test_key_chain_over_token_blocks_gives_the_block_by_block_keys(ops):
    chain, plain, seen = KeyChain(), {}, [[]]
    for base, cut, new in ops:
        prompt = seen[base % len(seen)][:cut] + new
        seen.append(prompt)
        assert list(chain.keys(TokenBlocks(b"".join(prompt), 2))) == chain_keys_plain(plain, prompt)
    assert isinstance(chain.content_of, TokenBlocks)  # every content was a 2-byte block
    assert len(chain) == len(plain)


def test_another_kind_of_contents_turns_the_token_store_into_a_list_with_the_same_keys():
    chain, plain = KeyChain(), {}
    runs = [[b"aa", b"bb"], [b"aa", b"cc"]]
    for prompt in runs:
        assert list(chain.keys(TokenBlocks(b"".join(prompt), 2))) == chain_keys_plain(plain, prompt)
    assert isinstance(chain.content_of, TokenBlocks)
    wider = [b"aaa", b"bbb"]  # another width: a list from now on
    assert list(chain.keys(TokenBlocks(b"".join(wider), 3))) == chain_keys_plain(plain, wider)
    assert isinstance(chain.content_of, list)
    for prompt in ([b"aa", b"bb", b"dd"], array("q", [7, 8])):
        contents = TokenBlocks(b"".join(prompt), 2) if isinstance(prompt, list) else prompt
        assert list(chain.keys(contents)) == chain_keys_plain(plain, list(prompt))
    ints = KeyChain()  # ints first, then token blocks
    assert list(ints.keys(array("q", [1, 2]))) == [0, 1]
    assert list(ints.keys(TokenBlocks(b"aabb", 2))) == [2, 3] and isinstance(ints.content_of, list)
    assert list(ints.keys(array("q", [1, 2, 3]))) == [0, 1, 4]
