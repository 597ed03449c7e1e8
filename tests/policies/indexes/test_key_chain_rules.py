"""Rules of the key chain (policies/indexes/key_chain.py) that mutation testing found unchecked: the
plain walk's root parent, the bisection's exact answer, the kinds of contents kept as they
come, and the walk's cost promise (strides that double from the first one, each a C-level comparison
of one slice of the run, token blocks compared as raw bytes)."""

from __future__ import annotations

from array import array

import pytest

from kvsim.policies.indexes import key_chain
from kvsim.policies.indexes.key_chain import KeyChain, _first_mismatch, chain_keys_plain
from kvsim.policies.indexes.token_blocks import TokenBlocks


@pytest.fixture(autouse=True)
def first_stride_16(monkeypatch):
    """The strides below are worked out for a first stride of 16 (the shipped one is longer:
    the rule is the same)."""
    monkeypatch.setattr(key_chain, "FIRST_STRIDE", 16)


def test_the_plain_walk_roots_a_prompt_at_parent_minus_one():
    plain: dict[tuple, int] = {}
    assert chain_keys_plain(plain, ["a", "b"]) == [0, 1]
    assert plain == {(-1, "a"): 0, (0, "b"): 1}


@pytest.mark.parametrize("got, want, at", [
    ([1, 2], [1, 3], 1), ([1, 2, 3], [1, 2, 4], 2), ([5, 2, 3], [1, 2, 3], 0),
    ([1, 2, 3, 4, 5], [1, 2, 3, 9, 5], 3), ([1, 2, 3], [1, 2, 3], 3), ([], [], 0),
])
def test_first_mismatch_is_the_index_of_the_first_difference(got, want, at):
    assert _first_mismatch(got, want) == at


def test_an_int_array_is_kept_as_it_is_and_another_int_array_is_converted():
    chain = KeyChain()
    ints = array("q", [4, 5, 6])
    assert chain._same_kind(ints) is ints  # compared as it is: no copy
    narrow = array("i", [4, 5, 7])  # 32-bit ints: joins the 64-bit store as a copy
    assert list(chain.keys(narrow)) == chain_keys_plain({}, [4, 5, 7]) == [0, 1, 2]
    assert list(chain.keys(ints)) == [0, 1, 3] and isinstance(chain.content_of, array)


class Spy:
    """Records the slices the walk compares: (kind of the stored slice, its length, the
    prompt slice's length)."""

    def __init__(self) -> None:
        self.calls: list[tuple[type, int, int]] = []

    def __call__(self, got, want):
        self.calls.append((type(got), len(got), len(want)))
        return _first_mismatch(got, want)


@pytest.mark.parametrize("length, slices", [
    (100, [16, 32, 51]),  # strides 16, 32, then the rest of the run
    (60, [16, 32, 11]),  # the prompt ends before the run: the last slice stops with it
    (18, [16, 1]),  # a last slice of one block
    (1, []),  # the first block alone: the dict walk finds it
])
def test_a_known_run_is_compared_in_strides_that_double(monkeypatch, length, slices):
    chain = KeyChain()
    chain.keys(list(range(100)))
    spy = Spy()
    monkeypatch.setattr(key_chain, "_first_mismatch", spy)
    assert list(chain.keys(list(range(length)))) == list(range(length))
    assert [(n, m) for _, n, m in spy.calls] == [(m, m) for m in slices]


def test_a_run_stops_one_before_the_next_branch_key(monkeypatch):
    """[0..99] then a branch (key 100, parent 39) at content 40's place: the run of key 0
    ends at key 99, so a walk of [0..99] compares 16, 32, 51 blocks and never key 100."""
    chain = KeyChain()
    chain.keys(list(range(100)))
    assert list(chain.keys([*range(40), -1])) == [*range(40), 100]
    spy = Spy()
    monkeypatch.setattr(key_chain, "_first_mismatch", spy)
    assert list(chain.keys(list(range(100)))) == list(range(100))
    assert [(n, m) for _, n, m in spy.calls] == [(16, 16), (32, 32), (51, 51)]


def test_token_blocks_are_compared_as_raw_bytes_a_run_at_a_time(monkeypatch):
    width = 4
    blocks = TokenBlocks(bytes(range(40 * width)), width)
    chain = KeyChain()
    chain.keys(blocks)
    spy = Spy()
    monkeypatch.setattr(key_chain, "_first_mismatch", spy)
    assert list(chain.keys(blocks)) == list(range(40))
    assert [(n, m) for _, n, m in spy.calls] == [(16 * width, 16 * width), (23 * width, 23 * width)]
    assert all(kind in (bytes, bytearray) for kind, _, _ in spy.calls)
