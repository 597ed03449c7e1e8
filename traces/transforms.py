"""Stream transforms: rescale time, cut a window, clip lengths, add sharing.

Each takes and returns an iterator of :class:`~traces.request.Request` sorted by
arrival time, and keeps the invariant that ``request_id`` runs 0, 1, 2, ... in
order (a transform that drops requests renumbers the rest). All are lazy; the
time window stops reading its input at the window's end.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Iterable, Iterator

from kvsim.traces.request import Request


def renumber(requests: Iterable[Request]) -> Iterator[Request]:
    """The same requests with ``request_id`` 0, 1, 2, ... in order."""
    for request_id, r in enumerate(requests):
        yield r if r.request_id == request_id else dataclasses.replace(r, request_id=request_id)


def scale_rate(requests: Iterable[Request], factor: float) -> Iterator[Request]:
    """Multiply the arrival rate by ``factor`` (> 0): every arrival time is divided by it,
    so 2.0 replays the trace twice as fast. Lengths are unchanged."""
    if not (math.isfinite(factor) and factor > 0):
        raise ValueError(f"rate scale factor must be a finite number > 0; got {factor!r}")
    if factor == 1.0:
        return iter(requests)
    return (dataclasses.replace(r, arrival_time=r.arrival_time / factor) for r in requests)


def window_by_time(
    requests: Iterable[Request], start_s: float = 0.0, duration_s: float | None = None
) -> Iterator[Request]:
    """Requests arriving in ``[start_s, start_s + duration_s)`` seconds, with times
    measured from ``start_s`` (the window starts at 0) and renumbered from 0.
    ``duration_s=None`` keeps everything after ``start_s``."""
    if not (math.isfinite(start_s) and start_s >= 0):
        raise ValueError(f"window start_s must be a finite number >= 0; got {start_s!r}")
    if duration_s is not None and not (math.isfinite(duration_s) and duration_s > 0):
        raise ValueError(f"window duration_s must be a finite number > 0; got {duration_s!r}")
    end = math.inf if duration_s is None else start_s + duration_s
    return _time_window(requests, start_s, end)


def _time_window(requests: Iterable[Request], start: float, end: float) -> Iterator[Request]:
    request_id = 0
    for r in requests:
        if r.arrival_time >= end:
            return
        if r.arrival_time >= start:
            if start > 0 or r.request_id != request_id:
                r = dataclasses.replace(
                    r, request_id=request_id, arrival_time=r.arrival_time - start
                )
            yield r
            request_id += 1


def window_by_count(requests: Iterable[Request], num_requests: int) -> Iterator[Request]:
    """The first ``num_requests`` requests (>= 1)."""
    if isinstance(num_requests, bool) or not isinstance(num_requests, int) or num_requests < 1:
        raise ValueError(f"window num_requests must be an integer >= 1; got {num_requests!r}")
    return itertools.islice(requests, num_requests)


def clip_to_max_len(requests: Iterable[Request], max_seq_len: int) -> Iterator[Request]:
    """Shorten requests longer than the model's ``max_seq_len`` tokens (prompt + output).

    The output is cut first (generation stops at the maximum length, as in vLLM);
    a prompt of ``max_seq_len`` tokens or more keeps its first ``max_seq_len - 1``
    tokens and gets one output token. Prefix identities (``hash_ids``,
    ``prefix_tokens``, ``token_ids``) are cut with the prompt: the start of a prompt is kept.
    """
    if isinstance(max_seq_len, bool) or not isinstance(max_seq_len, int) or max_seq_len < 2:
        raise ValueError(f"max_seq_len must be an integer >= 2; got {max_seq_len!r}")
    for r in requests:
        if r.prompt_tokens + r.output_tokens <= max_seq_len:
            yield r
            continue
        prompt = min(r.prompt_tokens, max_seq_len - 1)
        hash_ids = r.hash_ids
        if hash_ids is not None:
            hash_ids = hash_ids[: -(-prompt // r.hash_block_tokens)]
        yield dataclasses.replace(
            r,
            prompt_tokens=prompt,
            output_tokens=min(r.output_tokens, max_seq_len - prompt),
            prefix_tokens=min(r.prefix_tokens, prompt),
            hash_ids=hash_ids,
            token_ids=None if r.token_ids is None else r.token_ids[:prompt],
            output_token_ids=(None if r.output_token_ids is None
                              else r.output_token_ids[:min(r.output_tokens, max_seq_len - prompt)]),
        )


def apply_sharing(
    requests: Iterable[Request],
    *,
    n: int = 1,
    beam_width: int = 1,
    prefix_id: str | None = None,
    prefix_tokens: int = 0,
) -> Iterator[Request]:
    """Give every request ``n`` parallel samples or ``beam_width`` beams, and/or a
    shared prefix of ``prefix_tokens`` tokens (e.g. a system prompt) called
    ``prefix_id``, which is prepended: the prompt grows by ``prefix_tokens``.

    A prefix cannot be combined with ``hash_ids`` or ``token_ids`` (they would no longer
    describe the prompt): that raises ValueError.
    """
    for name, value in (("n", n), ("beam_width", beam_width)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be an integer >= 1; got {value!r}")
    if isinstance(prefix_tokens, bool) or not isinstance(prefix_tokens, int) or prefix_tokens < 0:
        raise ValueError(f"shared prefix tokens must be an integer >= 0; got {prefix_tokens!r}")
    if (prefix_id is None) != (prefix_tokens == 0):
        raise ValueError("a shared prefix needs both a prefix_id and tokens >= 1")
    if n == 1 and beam_width == 1 and prefix_id is None:
        return iter(requests)
    return _shared(requests, n, beam_width, prefix_id, prefix_tokens)


def _shared(requests, n, beam_width, prefix_id, prefix_tokens) -> Iterator[Request]:
    for r in requests:
        if prefix_id is None:
            yield dataclasses.replace(r, n=n, beam_width=beam_width)
            continue
        if r.hash_ids is not None or r.token_ids is not None:
            what = "hash_ids (prefix blocks" if r.hash_ids is not None else "token_ids (its prompt"
            raise ValueError(
                f"request {r.request_id} has {what} from its trace); "
                "a shared prefix cannot be added to it"
            )
        if r.prefix_id is not None:
            raise ValueError(f"request {r.request_id} already has prefix {r.prefix_id!r}")
        yield dataclasses.replace(
            r,
            n=n,
            beam_width=beam_width,
            prefix_id=prefix_id,
            prefix_tokens=prefix_tokens,
            prompt_tokens=r.prompt_tokens + prefix_tokens,
        )
