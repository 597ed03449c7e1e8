"""Fig. 2's Orca-Pow2: the README's internal fragmentation and buddy rounding are what the
full-size run gives (both numbers of the README's sentence, recomputed)."""

from __future__ import annotations

import re
from pathlib import Path

from kvsim.simulator.app.reproduce import run_experiments

README = Path(__file__).resolve().parents[3] / "README.md"


def test_the_readme_states_the_pow2_split_the_run_gives(tmp_path):
    result = run_experiments(tmp_path / "out", quick=False, only=("fig2",), workers=1, progress=False,
                             log=lambda _: None)["fig2"]
    row = result.table.set_index("system").loc["Orca-Pow2"]
    text = " ".join(README.read_text().split())
    found = re.search(r"Orca-Pow2's internal fragmentation is ([\d.]+)% of the KV cache \(the paper's bar: "
                      r"13\.6%\) and its rounding ([\d.]+)%", text)
    assert found, "the README's sentence on Orca-Pow2's split is gone"
    assert (float(found[1]), float(found[2])) == (round(row["mem_internal_frag_perc"], 1),
                                                  round(row["mem_allocator_frag_perc"], 1))
    assert row["mem_internal_frag_perc"] < row["mem_allocator_frag_perc"]  # the buddy wastes more
