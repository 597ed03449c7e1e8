"""A head of the queue refused for memory is not asked about again until memory is released
(simulator/sched/scheduler.py: ``_refused``; memory only shrinks while decoding), and is asked,
and admitted, as soon as it is."""

from kvsim.policies.kv_allocator import Admission
from kvsim.policies.ledger.paged_allocator import PagedAllocator
from kvsim.simulator.sched.scheduler import Scheduler, SchedulerSettings
from kvsim.traces import Request


def counting_scheduler(num_blocks: int, block_size: int = 4):
    """A v0 scheduler whose allocator counts ``check_admit`` calls (in ``asked``)."""
    alloc = PagedAllocator(num_blocks, block_size)
    asked: list[int] = []
    check = alloc.check_admit

    def counted(*args, **kwargs):
        asked.append(1)
        return check(*args, **kwargs)

    alloc.check_admit = counted
    limits = SchedulerSettings(max_seq_len=4096, watermark=0.0)
    return Scheduler(alloc, limits, lambda g: None), asked


def test_a_refused_head_is_asked_again_only_after_a_release():
    # 4 blocks of 4 slots: the first request's 8-token prompt takes 2 blocks and grows to
    # 11 tokens (3 blocks); the second's 9-token prompt needs 3 blocks: refused until the
    # first finishes and frees its blocks.
    s, asked = counting_scheduler(num_blocks=4)
    first = s.add(Request(0, 0.0, 8, 4), 0.0)
    second = s.add(Request(1, 0.0, 9, 2), 0.0)
    step = s.schedule(0.0)
    assert step.prefill == [first] and s.blocked is Admission.NO_SPACE and len(asked) == 2
    s.complete(step, 0.1)
    for k in range(2):  # decode steps: the refusal stands, nobody asks the allocator
        step = s.schedule(0.1 + k)
        assert step.decode == [first] and s.blocked is Admission.NO_SPACE
        s.complete(step, 0.2 + k)
    assert len(asked) == 2
    step = s.schedule(3.0)  # the first request's last token
    s.complete(step, 3.1)
    assert first.finish == 3.1
    step = s.schedule(3.1)  # its blocks were released: asked again, and admitted
    assert len(asked) == 3 and step.prefill == [second] and s.blocked is None


def test_a_new_head_is_asked_even_without_a_release():
    # The refused head leaves the queue's front (recomputed work goes back in front of it):
    # the kept verdict was about another group, so the allocator is asked.
    s, asked = counting_scheduler(num_blocks=4)
    s.add(Request(0, 0.0, 8, 4), 0.0)
    s.add(Request(1, 0.0, 9, 2), 0.0)
    s.complete(s.schedule(0.0), 0.1)
    before = len(asked)
    other = s.add(Request(2, 0.0, 4, 2), 0.0)
    s.waiting.rotate(1)  # put request 2 at the front, as a recompute would
    step = s.schedule(0.1)
    assert step.prefill == [other] and s.blocked is Admission.NO_SPACE
    assert len(asked) == before + 2  # request 2, admitted; then request 1 again, refused
