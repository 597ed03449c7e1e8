"""A generated multi-turn chat workload: every turn resends the whole conversation so far.

One conversation, turn by turn (token ids, drawn per conversation)::

    turn 1 prompt:  [system][user 1]                                -> answer 1
    turn 2 prompt:  [system][user 1][answer 1][user 2]              -> answer 2
    turn 3 prompt:  [system][user 1][answer 1][user 2][answer 2][user 3]

so turn k+1's prompt starts with turn k's prompt and its answer: a prefix cache that kept
turn k can serve all of it.

The three knobs of a conversation (:class:`MultiTurnSpec`; ranges drawn uniformly):

* turns per conversation: ``turns`` (min, max);
* growth per turn: turn k+1's prompt is turn k's prompt + its answer (``output_tokens``) +
  a new user message (``user_tokens``), so the prompt grows by both every turn and the
  k-th prompt holds ``system_prompt_tokens`` + k user messages + k - 1 answers;
* think time between turns: exponential with mean ``think_time_s`` (0: none), after the
  previous turn's assumed service time (below).

The system prompt is one of ``system_prompts`` shared by every conversation (a chat
service's fixed instructions), so conversations share it too. Every prompt carries its
``token_ids``, which is what both vLLM's block cache (chained block hashes) and SGLang's
radix cache (token by token) match on.

What a cache can hit. Every turn carries its answer's ids (``output_token_ids``), the very
ids the next prompt resends, and the engines name generated tokens by them
(``simulator.decoding.prefix_contents`` for vLLM v1's chained block hashes,
``policies.indexes.radix_cache.request_tokens`` for SGLang's tree): so turn k+1 hits its
conversation's cache through turn k's prompt *and* answer (as real engines do, chat-template
tokens aside), up to the last answer token, whose KV is never computed; only the new user
message is computed. When those tokens become hits: SGLang inserts a request's generated
tokens when it finishes; kvsim's vLLM v1 caches a generated block when its request frees it
(finish or preemption) rather than as it fills, which differs only for a turn that arrives
while the previous one still decodes (see below: a real user would not have the answer
yet). vLLM v0 (``scheduler.policy: vllm-v0``) caches prompt blocks only, so there turn k+1
hits up to the end of turn k's prompt.

Arrivals are open loop (the engine has no closed-loop clients). Conversations start by a
Poisson process (``conversation_rate`` per second); turn k+1 arrives at turn k's arrival
+ an *assumed* service time (``output_tokens_k x assumed_tpot_s``) + a think time drawn
from an exponential of mean ``think_time_s``. Consequence: when the simulated engine is
slower than assumed (overload), turn k+1 can arrive before turn k has finished, and a
real user would have waited instead; load does not throttle itself as with real clients,
so past saturation queues grow rather than the offered rate falling. When turn k+1
arrives before turn k's prefill has put its prompt in the cache, it misses.

Deterministic per seed, and each conversation draws from its own child stream of the seed
(``SeedSequence(seed, spawn_key=(1, c))``), so conversation c's turns do not change when
other conversations or the start rate change. Requests stream in arrival order with bounded
memory: only conversations still running are held.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from kvsim.traces.request import Request

LLAMA3_VOCAB = 128_256
"""Llama-3's vocabulary size: token ids are drawn uniformly below it (any large vocabulary
works: ids only need to differ where contents differ)."""


@dataclass(frozen=True)
class MultiTurnSpec:
    """The knobs of :func:`generate_multi_turn`. Ranges are ``(min, max)``, inclusive,
    drawn uniformly; lengths in tokens, times in seconds."""

    conversations: int
    conversation_rate: float  # new conversations per second (Poisson)
    turns: tuple[int, int] = (2, 6)  # turns per conversation
    system_prompt_tokens: int = 0  # tokens of the shared system prompt (0: none)
    system_prompts: int = 1  # distinct system prompts; a conversation picks one uniformly
    user_tokens: tuple[int, int] = (50, 300)  # new user message per turn
    output_tokens: tuple[int, int] = (100, 400)  # answer per turn
    think_time_s: float = 10.0  # mean of the exponential pause before the next turn
    assumed_tpot_s: float = 0.02  # seconds per output token, to estimate a turn's service
    vocab_size: int = LLAMA3_VOCAB

    def __post_init__(self) -> None:
        def integer(name: str, value: object, low: int) -> None:
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"{name} must be an integer >= {low}; got {value!r}")

        def number(name: str, value: object, positive: bool) -> None:
            ok = not isinstance(value, bool) and isinstance(value, int | float) and math.isfinite(value)
            if not ok or value < 0 or (positive and value == 0):
                raise ValueError(f"{name} must be a finite number {'> 0' if positive else '>= 0'}; got {value!r}")

        integer("conversations", self.conversations, 1)
        number("conversation_rate", self.conversation_rate, True)
        for name in ("turns", "user_tokens", "output_tokens"):
            pair = getattr(self, name)
            if not (isinstance(pair, tuple) and len(pair) == 2):
                raise ValueError(f"{name} must be a (min, max) pair; got {pair!r}")
            integer(f"{name} min", pair[0], 1)
            integer(f"{name} max", pair[1], pair[0])
        integer("system_prompt_tokens", self.system_prompt_tokens, 0)
        integer("system_prompts", self.system_prompts, 1)
        number("think_time_s", self.think_time_s, False)
        number("assumed_tpot_s", self.assumed_tpot_s, False)
        integer("vocab_size", self.vocab_size, 2)


@dataclass(slots=True)
class _Conversation:
    """A running conversation: its random stream, the token ids sent so far (system prompt,
    earlier user messages and answers) and the turns left."""

    rng: np.random.Generator
    history: tuple[int, ...]
    turns_left: int


def generate_multi_turn(spec: MultiTurnSpec, *, seed: int) -> Iterator[Request]:
    """The conversations' turns as requests, in arrival order, numbered 0, 1, 2, ...

    The first conversation starts at t = 0 s. Ties in arrival time go to the conversation
    that started first.
    """
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ValueError(f"seed must be an integer >= 0; got {seed!r}")
    return _stream(spec, seed)


def _tokens(rng: np.random.Generator, count: int, vocab: int) -> tuple[int, ...]:
    return tuple(rng.integers(0, vocab, size=count).tolist())


def _draw(rng: np.random.Generator, pair: tuple[int, int]) -> int:
    return int(rng.integers(pair[0], pair[1] + 1))


def _stream(spec: MultiTurnSpec, seed: int) -> Iterator[Request]:
    system = [
        _tokens(np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(2, i))),
                spec.system_prompt_tokens, spec.vocab_size)
        for i in range(spec.system_prompts)
    ]
    starts = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(0,)))
    live: dict[int, _Conversation] = {}
    pending: list[tuple[float, int]] = []  # (arrival time of its next turn, conversation)
    started, next_start = 0, 0.0
    request_id = 0
    while pending or started < spec.conversations:
        # start every conversation whose first turn comes before the earliest pending turn
        while started < spec.conversations and (not pending or next_start <= pending[0][0]):
            rng = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(1, started)))
            turns = _draw(rng, spec.turns)
            pick = int(rng.integers(spec.system_prompts))
            live[started] = _Conversation(rng, system[pick], turns)
            heapq.heappush(pending, (next_start, started))
            started += 1
            next_start += float(starts.exponential(1.0 / spec.conversation_rate))
        time, c = heapq.heappop(pending)
        conv = live[c]
        rng = conv.rng
        prompt = conv.history + _tokens(rng, _draw(rng, spec.user_tokens), spec.vocab_size)
        output = _draw(rng, spec.output_tokens)
        # The answer is drawn before the turn is sent (the same draws, in the same order, as
        # when it was drawn only for the next prompt: the last turn's come after every other
        # draw of its conversation, so no other turn changes).
        answer = _tokens(rng, output, spec.vocab_size)
        yield Request(request_id, time, len(prompt), output, token_ids=prompt, output_token_ids=answer)
        request_id += 1
        conv.turns_left -= 1
        if conv.turns_left == 0:
            del live[c]
            continue
        conv.history = prompt + answer  # the answer, resent
        think = float(rng.exponential(spec.think_time_s)) if spec.think_time_s > 0 else 0.0
        heapq.heappush(pending, (time + output * spec.assumed_tpot_s + think, c))


__all__ = ["LLAMA3_VOCAB", "MultiTurnSpec", "generate_multi_turn"]
