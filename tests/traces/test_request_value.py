"""A ``Request`` is a value: equal and hashed by its fields (as when it was a frozen
dataclass), changed only by ``dataclasses.replace``, and slotted (a million-request trace
holds no per-request ``__dict__``)."""

import copy
import dataclasses
import pickle

from kvsim.traces import Request


def test_requests_are_equal_and_hash_by_their_fields():
    a = Request(1, 0.5, 10, 20, token_ids=(1, 2, 3))
    b = Request(1, 0.5, 10, 20, token_ids=(1, 2, 3))
    assert a == b and hash(a) == hash(b) and len({a, b}) == 1 and {a: "x"}[b] == "x"
    other = Request(1, 0.5, 10, 20, token_ids=(1, 2, 4))
    assert other != a and len({a, other}) == 2


def test_replace_makes_a_new_request_and_leaves_the_old_one():
    a = Request(7, 1.25, 100, 5, priority=2)
    b = dataclasses.replace(a, output_tokens=6)
    assert (a.output_tokens, b.output_tokens) == (5, 6)
    assert dataclasses.astuple(b)[:4] == (7, 1.25, 100, 6) and b.priority == 2


def test_a_request_has_no_instance_dict():
    assert not hasattr(Request(0, 0.0, 1, 1), "__dict__")


def test_a_request_survives_pickling_and_copying():
    """As the frozen dataclass did (worker processes receive what they run by pickle)."""
    r = Request(3, 0.5, 2, 2, token_ids=(5, 6), output_token_ids=(7, 8))
    assert pickle.loads(pickle.dumps(r)) == r and copy.copy(r) == r and copy.deepcopy(r) == r
