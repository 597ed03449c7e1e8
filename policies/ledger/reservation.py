"""How many slots a contiguous allocator reserves for a sequence up front.

A contiguous region cannot grow in place, so a sequence must reserve, when it
is admitted, room for every token it may ever store. The vLLM paper
(Kwon et al., SOSP 2023, section 6.1) compares three Orca variants that differ
only in this reservation:

- ``max``: the model's maximum sequence length (e.g. 2048 tokens) -- Orca-Max,
  and FasterTransformer's static buffers.
- ``pow2``: the prompt plus the true *output* length rounded up to a power of
  two -- Orca-Pow2. The paper's example: a 25-token output gets 32 slots. Only the
  output is rounded (the prompt is known exactly when the request arrives), so the
  over-reservation is below the output length, not below the whole sequence's.
- ``oracle``: exactly the true final length -- Orca-Oracle.

``final_len`` is the number of tokens a sequence will finally store,
``prompt_len + output_tokens - 1`` (see ``policies.kv_allocator``: the last
token's KV is never stored), so the output still to come is
``final_len - prompt_len + 1`` tokens. ``prompt_len`` is what the sequence
stores when it is placed (a recomputed or forked sequence stores its generated
tokens too, and only its remaining output is rounded). Only the ``pow2`` and
``oracle`` policies look at ``final_len``, and only because they are defined as
knowing the output length in advance.
"""

from __future__ import annotations

RESERVATION_POLICIES = ("max", "pow2", "oracle")


def next_power_of_two(n: int) -> int:
    """The smallest power of two >= ``n`` (``n`` >= 1): 25 -> 32, 32 -> 32."""
    return 1 << (n - 1).bit_length()


def reservation_slots(policy: str, prompt_len: int, final_len: int, max_seq_len: int) -> int:
    """Slots (tokens) to reserve for one sequence.

    ``pow2`` never reserves more than ``max_seq_len`` (no sequence may be
    longer). A result below ``final_len`` (``max`` or ``pow2`` with a sequence
    longer than ``max_seq_len``) means the sequence can never complete in its
    region; the allocator rejects it. ``oracle`` ignores ``max_seq_len``.
    """
    if prompt_len < 1:
        raise ValueError(f"prompt_len must be >= 1 token, got {prompt_len}")
    if final_len < prompt_len:
        raise ValueError(f"final_len ({final_len}) must be >= prompt_len ({prompt_len})")
    if max_seq_len < 1:
        raise ValueError(f"max_seq_len must be >= 1 token, got {max_seq_len}")
    if policy == "max":
        return max_seq_len
    if policy == "pow2":
        output_len = final_len - prompt_len + 1
        return min(prompt_len + next_power_of_two(output_len), max_seq_len)
    if policy == "oracle":
        return final_len
    raise ValueError(
        f"unknown reservation policy {policy!r}; allowed: {', '.join(RESERVATION_POLICIES)}"
    )
