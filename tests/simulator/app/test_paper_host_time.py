"""The paper's 2023 engines do host work on every step, and every system is charged alike."""

from __future__ import annotations

import pytest

from kvsim.simulator.app.reproduce import CONFIG_DIR, EXPERIMENTS
from kvsim.simulator.app.sweep import expand_points, load_sweep, resolve_config
from kvsim.simulator.cost_model.host_time import host_preset

PAPER_SWEEPS = [e.sweep for e in EXPERIMENTS if not e.sweep.startswith("mooncake")]


@pytest.mark.parametrize("sweep", PAPER_SWEEPS)
def test_every_system_of_every_paper_sweep_pays_the_2023_host_time(sweep):
    spec = load_sweep(CONFIG_DIR / sweep)
    expected = host_preset("vllm-2023-a100")
    charged = {p.label: resolve_config(spec, p).cost_model.host_time for p in expand_points(spec)}
    assert charged and all(h == expected for h in charged.values()), charged


def test_the_2023_host_time_grows_with_the_batch():
    """Per sequence, not only per step: a batch of 64 costs more than one of 8 (Vidur's
    cpu_overheads.csv: about 3.0 ms at batch 8 and 12.6 ms at batch 64)."""
    h = host_preset("vllm-2023-a100")
    assert h.seconds(8) == pytest.approx(3.0e-3, rel=0.02)
    assert h.seconds(64) == pytest.approx(12.6e-3, rel=0.02)
