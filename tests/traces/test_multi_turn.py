"""The multi-turn chat generator: prefix structure, counts, arrivals, determinism, bad input."""

from __future__ import annotations

import statistics
from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

from kvsim.simulator.config import ConfigError, load_config
from kvsim.simulator.workload import WorkloadConfig, build_requests
from kvsim.traces.multi_turn import MultiTurnSpec, generate_multi_turn

SPEC = MultiTurnSpec(conversations=30, conversation_rate=2.0, turns=(1, 5), system_prompt_tokens=40,
                     system_prompts=2, user_tokens=(3, 9), output_tokens=(2, 7), think_time_s=1.0,
                     assumed_tpot_s=0.1)


def conversations(requests):
    """Group turns into conversations: a turn continues the conversation whose last turn's
    prompt it starts with (prompts are random, so a foreign match is out of reach)."""
    convs: list[list] = []
    for r in requests:
        owner = [c for c in convs if r.token_ids[: c[-1].prompt_tokens] == c[-1].token_ids]
        assert len(owner) <= 1
        (owner[0].append(r) if owner else convs.append([r]))
    return convs


def test_every_turn_resends_the_previous_turn_and_its_answer():
    requests = list(generate_multi_turn(SPEC, seed=3))
    convs = conversations(requests)
    assert len(convs) == SPEC.conversations
    for conv in convs:
        assert 1 <= len(conv) <= 5
        for a, b in zip(conv, conv[1:]):
            # b = a's prompt + a's answer (a.output_tokens tokens) + a new user message (3..9)
            assert b.token_ids[: a.prompt_tokens] == a.token_ids
            assert 3 <= b.prompt_tokens - a.prompt_tokens - a.output_tokens <= 9
            # open loop: think time (>= 0) after the assumed service time
            assert b.arrival_time >= a.arrival_time + a.output_tokens * SPEC.assumed_tpot_s - 1e-9
        assert 40 + 3 <= conv[0].prompt_tokens <= 40 + 9
    systems = {c[0].token_ids[:40] for c in convs}
    assert len(systems) == 2  # two system prompts, shared across conversations


def test_requests_are_numbered_in_arrival_order_and_lengths_match_token_ids():
    requests = list(generate_multi_turn(SPEC, seed=0))
    assert [r.request_id for r in requests] == list(range(len(requests)))
    times = [r.arrival_time for r in requests]
    assert times == sorted(times) and times[0] == 0.0
    assert all(len(r.token_ids) == r.prompt_tokens and 2 <= r.output_tokens <= 7 for r in requests)


def test_turn_counts_follow_the_range():
    fixed = MultiTurnSpec(conversations=12, conversation_rate=1.0, turns=(4, 4))
    assert len(list(generate_multi_turn(fixed, seed=0))) == 48
    spread = MultiTurnSpec(conversations=400, conversation_rate=5.0, turns=(1, 3), think_time_s=0.0)
    counts = [len(c) for c in conversations(generate_multi_turn(spread, seed=1))]
    assert set(counts) == {1, 2, 3}


def test_same_seed_same_workload_other_seed_other_workload():
    a = list(generate_multi_turn(SPEC, seed=7))
    assert a == list(generate_multi_turn(SPEC, seed=7))
    assert a != list(generate_multi_turn(SPEC, seed=8))


def test_a_conversation_does_not_change_with_the_start_rate():
    slow = conversations(generate_multi_turn(SPEC, seed=5))
    fast = conversations(generate_multi_turn(MultiTurnSpec(**{**SPEC.__dict__, "conversation_rate": 50.0}), seed=5))
    first = {c[0].token_ids: [r.token_ids for r in c] for c in slow}
    assert all(first[c[0].token_ids] == [r.token_ids for r in c] for c in fast)


def test_conversation_starts_are_poisson_at_the_rate():
    spec = MultiTurnSpec(conversations=2000, conversation_rate=4.0, turns=(1, 1), user_tokens=(1, 1),
                         output_tokens=(1, 1))
    times = [r.arrival_time for r in generate_multi_turn(spec, seed=2)]
    assert len(times) == 2000
    assert times[-1] / 1999 == pytest.approx(0.25, rel=0.1)  # mean gap 1 / rate


@pytest.mark.parametrize("field, value, message", [
    ("conversations", 0, "conversations must be an integer >= 1"),
    ("conversation_rate", 0.0, "conversation_rate must be a finite number > 0"),
    ("turns", (3, 2), "turns max must be an integer >= 3"),
    ("think_time_s", -1.0, "think_time_s must be a finite number >= 0"),
])
def test_bad_spec_is_a_one_line_error(field, value, message):
    with pytest.raises(ValueError, match=message):
        MultiTurnSpec(**{**SPEC.__dict__, field: value})


# --- the workload config section -------------------------------------------------------------


def config(text: str) -> WorkloadConfig:
    return WorkloadConfig.model_validate(yaml.safe_load(text))


def test_config_builds_the_generator_s_requests():
    cfg = config("{multi_turn: {conversations: 30, conversation_rate: 2.0, turns: {min: 1, max: 5}, "
                 "system_prompt_tokens: 40, system_prompts: 2, user_tokens: {min: 3, max: 9}, "
                 "output_tokens: {min: 2, max: 7}, think_time_s: 1.0, assumed_tpot_s: 0.1}}")
    built = list(build_requests(cfg, base_dir=Path("."), seed=3))
    assert built == list(generate_multi_turn(SPEC, seed=3))
    windowed = config("{multi_turn: {conversations: 30, conversation_rate: 2.0}, window: {num_requests: 10}}")
    assert len(list(build_requests(windowed, base_dir=Path("."), seed=3))) == 10


@pytest.mark.parametrize("extra, message", [
    ("turns: {min: 4, max: 2}", "turns: max .2. must be >= min .4."),
    ("system_prompts: 0", "system_prompts: Input should be greater than or equal to 1"),
    ("user_tokens: {min: 1, max: 5, mean: 3}", "mean"),
    ("think_time_s: true", "think_time_s: must be a number"),
])
def test_bad_section_names_the_key(tmp_path, extra, message):
    path = tmp_path / "c.yaml"
    path.write_text(
        "name: t\nmodel: {name: llama-2-7b}\nhardware: {gpu: a100-80gb}\n"
        f"workload:\n  multi_turn: {{conversations: 5, conversation_rate: 1.0, {extra}}}\n"
    )
    with pytest.raises(ConfigError) as e:
        load_config(path)
    text = str(e.value)
    assert "workload.multi_turn" in text and len(text.splitlines()) == 1
    assert __import__("re").search(message, text), text


@pytest.mark.parametrize("other", ["arrivals: {kind: poisson, rate: 1.0}", "rate_scale: 2.0",
                                   "shared_prefix: {tokens: 10}", "num_requests: 5"])
def test_multi_turn_is_its_own_source(other):
    with pytest.raises(ValidationError, match="a multi_turn workload makes its own requests"):
        config(f"{{multi_turn: {{conversations: 5, conversation_rate: 1.0}}, {other}}}")


# --- the three knobs: turns, growth per turn, think time ---------------------------------------


def test_growth_per_turn_is_the_answer_plus_the_user_message():
    """With fixed lengths, the k-th prompt is the system prompt + k user messages + k - 1
    answers, and its tail beyond the previous prompt is exactly that turn's answer ids then
    a new message."""
    spec = MultiTurnSpec(conversations=5, conversation_rate=1.0, turns=(4, 4), system_prompt_tokens=10,
                         user_tokens=(7, 7), output_tokens=(5, 5), think_time_s=0.0)
    for conv in conversations(generate_multi_turn(spec, seed=4)):
        assert [r.prompt_tokens for r in conv] == [10 + 7 * k + 5 * (k - 1) for k in range(1, 5)]
        for a, b in zip(conv, conv[1:]):
            assert b.token_ids[a.prompt_tokens: a.prompt_tokens + 5] == a.output_token_ids


def test_think_time_is_exponential_after_the_assumed_service_time():
    """think_time_s = 0: each turn follows the previous one by exactly output x assumed_tpot_s;
    otherwise the extra gap averages think_time_s (exponential: its sd equals its mean)."""
    base = dict(conversations=300, conversation_rate=1.0, turns=(2, 2), user_tokens=(1, 1),
                output_tokens=(10, 10), assumed_tpot_s=0.5)
    for think, mean in ((0.0, 0.0), (4.0, 4.0)):
        gaps = [b.arrival_time - a.arrival_time - 10 * 0.5
                for a, b in conversations(generate_multi_turn(MultiTurnSpec(**base, think_time_s=think),
                                                              seed=6))]
        assert len(gaps) == 300 and min(gaps) >= -1e-9
        if mean == 0.0:
            assert max(gaps) == pytest.approx(0.0, abs=1e-9)
        else:
            assert sum(gaps) / len(gaps) == pytest.approx(mean, rel=0.15)
            assert statistics.pstdev(gaps) == pytest.approx(mean, rel=0.2)
