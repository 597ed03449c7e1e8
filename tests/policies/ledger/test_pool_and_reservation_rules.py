"""Edges of the block pool and the reservation policies that mutation testing found
unchecked: the one-line errors say what went wrong, ``check`` names the broken
invariant, and a model whose context is one token is a valid model."""

import pytest

from kvsim.policies.ledger.block_pool import BlockPool, OutOfBlocks, QueuedBlockPool
from kvsim.policies.ledger.reservation import reservation_slots


def test_pool_keeps_its_block_size():
    assert BlockPool(4, 16).block_size == 16


@pytest.mark.parametrize("args, message", [
    ((-1, 16), "num_blocks must be >= 0, got -1"),
    ((4, 0), "block_size must be >= 1, got 0"),
])
def test_pool_rejects_impossible_sizes_with_the_value(args, message):
    with pytest.raises(ValueError, match=message):
        BlockPool(*args)


@pytest.mark.parametrize("pool_type", [BlockPool, QueuedBlockPool])
def test_pool_errors_say_what_ran_out_or_was_misused(pool_type):
    pool = pool_type(2, 4)
    with pytest.raises(OutOfBlocks, match="asked for 3 blocks, 2 free"):
        pool.allocate_many(3)
    a, b = pool.allocate_many(2)
    with pytest.raises(OutOfBlocks, match="all 2 blocks are in use"):
        pool.allocate()
    pool.release(a)
    with pytest.raises(ValueError, match=f"block {a} is free and cannot be shared"):
        pool.share(a)
    with pytest.raises(ValueError, match=f"block {a} released more often than held"):
        pool.release(a)
    with pytest.raises(ValueError, match=f"block {a} released more often than held"):
        pool.release_all([b, a])


@pytest.mark.parametrize("corrupt, message", [
    (lambda p: p._free.append(p._free[-1]), "a block is on the free list twice"),
    (lambda p: p._free.append(p.num_blocks), "free list holds a foreign block"),
    (lambda p: p._refcount.__setitem__(p.allocate(), -1), "negative refcount"),
    (lambda p: p._free.pop(), "blocks are not conserved"),
])
def test_check_names_the_broken_invariant(corrupt, message):
    pool = BlockPool(4, 4)
    pool.check()
    corrupt(pool)
    with pytest.raises(AssertionError, match=f"^{message}$"):
        pool.check()


@pytest.mark.parametrize("policy", ["max", "pow2", "oracle"])
def test_a_one_token_model_reserves_one_slot(policy):
    assert reservation_slots(policy, 1, 1, 1) == 1


def test_reservation_errors_give_the_value():
    with pytest.raises(ValueError, match="max_seq_len must be >= 1 token, got 0"):
        reservation_slots("max", 1, 1, 0)
    with pytest.raises(ValueError, match="prompt_len must be >= 1 token, got 0"):
        reservation_slots("max", 0, 1, 8)
    with pytest.raises(ValueError, match=r"final_len \(2\) must be >= prompt_len \(3\)"):
        reservation_slots("max", 3, 2, 8)
    with pytest.raises(ValueError, match="unknown reservation policy 'best'; allowed: max, pow2, oracle"):
        reservation_slots("best", 1, 1, 8)
