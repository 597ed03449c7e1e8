"""The SGLang memory bench cases and the start-up bench: their configs are what they say, and
a quiet run reaches its first event without loading pandas, pyarrow, matplotlib or rich (what
start-up time the bench reports is not checked here)."""

import json
import tempfile

from benchmarks.run import CASES
from benchmarks.startup import measure_once
from kvsim.simulator.config import validate_config


def _config(name: str):
    return validate_config(json.loads(json.dumps(CASES[name][1])) | {"name": name}, source=name)


def test_sglang_cases_are_long_conversations_on_the_radix_cache():
    small, large = _config("sg3k"), _config("sg12k")
    for cfg in (small, large):
        assert cfg.scheduler.policy == "sglang" and cfg.allocator.block_size == 1
    mt = large.workload.multi_turn
    assert mt.conversations == 1_000 and 140e6 <= mt.expected_prompt_tokens() <= 155e6
    assert mt.conversations * (mt.turns.min + mt.turns.max) / 2 == 12_000
    assert small.workload.multi_turn.model_dump() | {"conversations": 0} == mt.model_dump() | {"conversations": 0}


def test_a_run_starts_without_the_libraries_that_write_and_draw_results():
    with tempfile.TemporaryDirectory() as out:
        assert measure_once(out)["loaded"] == []
