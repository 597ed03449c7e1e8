"""The prefix-caching benchmark cases (speed): their configs are what the targets
names, and their table prints like the README's."""

import json

from benchmarks.run import (
    CASES,
    MOONCAKE_DISTINCT_TOKENS,
    PREFIX_CACHE_PER_REQUEST,
    PREFIX_CACHE_ROWS,
    readme_table,
)
from kvsim.simulator.config import validate_config


def _config(name: str):
    return validate_config(json.loads(json.dumps(CASES[name][1])) | {"name": name}, source=name)


def test_mooncake_cases_hold_every_distinct_token_and_differ_only_in_block_size():
    small, large = _config("moon16"), _config("moon256")
    # 43,924 distinct 512-token blocks + outputs + a partial prompt and output block each
    assert MOONCAKE_DISTINCT_TOKENS >= 43_924 * 512 + 595_432 + 3_993 * (512 + 16)
    for cfg, bs in ((small, 16), (large, 256)):
        assert cfg.allocator.block_size == bs and cfg.allocator.prefix_caching
        assert cfg.hardware.num_gpu_blocks * bs >= MOONCAKE_DISTINCT_TOKENS
        assert cfg.scheduler.policy == "vllm-v1" and cfg.scheduler.max_num_batched_tokens == 8192
        assert cfg.workload.window is None  # the whole trace
    assert small.model.context_len_tokens == 131072


def test_multi_turn_cases_scale_conversations_only():
    cfgs = [_config(n) for n in ("mt10k", "mt30k", "mt100k")]
    assert [c.workload.multi_turn.conversations for c in cfgs] == [2_000, 6_000, 20_000]
    rest = [c.workload.multi_turn.model_dump() | {"conversations": 0} for c in cfgs]
    assert rest[0] == rest[1] == rest[2]


def test_prefix_cache_table_prints_its_rows_and_cost_per_request():
    fake = {c: {"wall_s": 2.0, "peak_rss_mib": 100.0, "requests": 4_000}
            for _, cases in PREFIX_CACHE_ROWS for c in cases}
    text = readme_table(fake, PREFIX_CACHE_ROWS, PREFIX_CACHE_PER_REQUEST)
    assert text.count("| 2 s / 2 s |") == 1 and "| 2 s / 2 s / 2 s |" in text
    assert text.endswith("wall time per request: moon16: 500 µs, moon256: 500 µs, "
                         "mt10k: 500 µs, mt30k: 500 µs, mt100k: 500 µs")
