"""The request record every loader and generator produces."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True, unsafe_hash=True)
class Request:
    """One inference request as it arrives at the serving system.

    Times are in seconds from the start of the trace; lengths in tokens.
    ``output_tokens`` is the true output length: the simulator uses it to know
    when a sequence ends, a policy only if it is an oracle.

    A value: treat it as read-only (change one with ``dataclasses.replace``); equal and
    hashed by its fields, as a frozen one. Not frozen only because a frozen dataclass sets
    each field through ``object.__setattr__``: ~20,000 instructions to build one against
    ~4,000 (cachegrind), and every request of a trace is built once.
    """

    request_id: int
    arrival_time: float
    prompt_tokens: int
    output_tokens: int
    n: int = 1  # parallel samples
    beam_width: int = 1
    prefix_id: str | None = None  # a prefix shared by several requests ...
    prefix_tokens: int = 0  # ... and its length (<= prompt_tokens)
    hash_ids: tuple[int, ...] | None = None  # prefix-block identities (Mooncake)
    hash_block_tokens: int = 512  # tokens covered by one hash id
    #: the prompt's token ids (``prompt_tokens`` of them), when the trace records them: prefix-cache
    #: block identities then come from the tokens themselves, exact at any block size
    token_ids: tuple[int, ...] | None = None
    #: scheduling priority (larger = more important); the prefix caches' ``priority`` eviction
    #: policy evicts what only low-priority requests used first (SGLang's and TensorRT-LLM's rule)
    priority: int = 0
    #: the answer's token ids (``output_tokens`` of them), when the trace knows them (a multi-turn
    #: conversation resends them in its next prompt): the engines then name the generated tokens
    #: by them, so a later prompt that contains prompt + answer hits the answer's KV too. Needs
    #: ``token_ids`` (a generated token is shareable only after a prompt named by its content).
    #: Parallel samples and beams (n, beam_width > 1) keep private generated tokens.
    output_token_ids: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        out = self.output_token_ids
        if out is None:
            return
        if len(out) != self.output_tokens:
            raise ValueError(f"request {self.request_id}: output_token_ids has {len(out)} ids but "
                             f"output_tokens is {self.output_tokens} (they must be equal)")
        if self.token_ids is None:
            raise ValueError(f"request {self.request_id}: output_token_ids needs token_ids (the "
                             "prompt's ids) too")

    @property
    def num_seqs(self) -> int:
        """Sequences the request runs as: samples or beams share one prompt."""
        return max(self.n, self.beam_width)
