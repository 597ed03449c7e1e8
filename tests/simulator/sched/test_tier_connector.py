"""The tier connector: each call reaches the tier stack once, with the blocks the scheduler
names, their chain parents and the request's priority."""

from __future__ import annotations

from kvsim.simulator.sched.tier_connector import TierConnector


class RecordingStack:
    """A tier stack that records every call and holds blocks named below ``ready_below``."""

    def __init__(self, write: str = "write-through", ready_below: int = 0):
        self.stores_gpu_evictions = write == "write-back"
        self.counts_gpu_hits = write == "write-through-after-hits"
        self.ready_below = ready_below
        self.calls: list[tuple] = []

    def lookup(self, keys, now):
        keys = list(keys)
        self.calls.append(("lookup", keys, now))
        found = []
        for k in keys:
            if k[1] >= self.ready_below:
                break
            found.append(0)
        return found

    def start_load(self, keys, providers, now, priority):
        self.calls.append(("start_load", list(keys), list(providers), now, priority))
        return now + 0.5

    def gpu_hits(self, keys, parents, priority):
        self.calls.append(("gpu_hits", list(keys), list(parents), priority))

    def write_through(self, keys, parents, priorities, now):
        self.calls.append(("write_through", list(keys), list(parents), list(priorities), now))

    def flush_scheduling(self, now):
        self.calls.append(("flush_scheduling", now))


def names(group, start, stop):
    """Block j of request ``group`` is called (group, j)."""
    return ((group, j) for j in range(start, stop))


def test_found_asks_for_the_blocks_after_the_hit_and_stops_at_the_first_missing():
    stack = RecordingStack(ready_below=5)
    c = TierConnector(stack, names)
    assert c.found("r", 2, 9, 1.0) == [0, 0, 0]
    assert stack.calls == [("lookup", [("r", j) for j in range(2, 9)], 1.0)]


def test_found_asks_nothing_when_the_hit_reaches_the_cap():
    stack = RecordingStack(ready_below=5)
    c = TierConnector(stack, names)
    assert c.found("r", 4, 4, 1.0) == []
    assert c.found("r", 5, 4, 1.0) == []
    assert stack.calls == []


def test_load_names_the_found_blocks_and_returns_when_it_ends():
    stack = RecordingStack()
    done, keys = TierConnector(stack, names).load("r", 3, [0, 1], 2.0, priority=7)
    assert (done, keys) == (2.5, [("r", 3), ("r", 4)])
    assert stack.calls == [("start_load", [("r", 3), ("r", 4)], [0, 1], 2.0, 7)]


def test_gpu_hits_reach_the_stack_only_where_after_hits_counts_them():
    plain, counting = RecordingStack(), RecordingStack("write-through-after-hits")
    for stack in (plain, counting):
        c = TierConnector(stack, names)
        c.gpu_hits("r", 0, 1)
        c.gpu_hits("r", 3, 1)
    assert plain.calls == []
    assert counting.calls == [("gpu_hits", [("r", 0), ("r", 1), ("r", 2)], [None, ("r", 0), ("r", 1)], 1)]


def test_computed_blocks_go_out_in_one_write_through_when_the_step_ends():
    stack = RecordingStack()
    c = TierConnector(stack, names)
    c.computed("a", 0, 2, 1)
    c.computed("b", 3, 5, 4)  # its first block's parent is its block 2
    c.computed("c", 2, 2, 9)  # nothing filled
    assert stack.calls == []
    c.step_ended(3.0)
    assert stack.calls == [("write_through", [("a", 0), ("a", 1), ("b", 3), ("b", 4)],
                            [None, ("a", 0), ("b", 2), ("b", 3)], [1, 1, 4, 4], 3.0)]
    c.step_ended(4.0)  # nothing new: no empty batch
    assert len(stack.calls) == 1


def test_a_scheduling_end_flushes_the_stack_and_write_back_is_reported():
    stack = RecordingStack("write-back")
    c = TierConnector(stack, names)
    c.scheduled(5.0)
    assert stack.calls == [("flush_scheduling", 5.0)]
    assert c.stores_gpu_evictions and not TierConnector(RecordingStack(), names).stores_gpu_evictions
