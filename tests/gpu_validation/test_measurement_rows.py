"""``time_row``: a point that runs gives one row (its columns, then ``seconds``); a point
that fails gives none, and the grid goes on."""

import pytest

torch = pytest.importorskip("torch")

from kvsim.gpu_validation.measurements import time_row  # noqa: E402


class FakeTimer:
    """Calls ``fn`` once and reports a fixed median; records the ``reps`` it was asked for."""

    reps = 7

    def __init__(self, seconds: float):
        self.seconds, self.asked = seconds, []

    def __call__(self, fn, reps=None):
        self.asked.append(reps)
        fn()
        return self.seconds


def test_a_point_that_runs_appends_its_row_with_seconds_last():
    rows = [{"section": "earlier"}]
    timer = FakeTimer(2.5e-5)
    t = time_row(rows, timer, lambda: None, "p", reps=3, section="gemm", m=8, n=16)
    assert t == 2.5e-5
    assert rows[1] == {"section": "gemm", "m": 8, "n": 16, "seconds": 2.5e-5}
    assert list(rows[1]) == ["section", "m", "n", "seconds"]  # the CSV's column order
    assert timer.asked == [3]


def test_a_point_that_fails_appends_nothing(capsys):
    def too_big():
        raise RuntimeError("out of shared memory\nsecond line")

    rows = []
    assert time_row(rows, FakeTimer(1.0), too_big, "decode bs=256", section="decode") is None
    assert rows == []
    assert "skipped decode bs=256: RuntimeError: out of shared memory" in capsys.readouterr().out
