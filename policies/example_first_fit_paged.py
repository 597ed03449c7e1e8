"""An example allocation policy in one small file: paged, lowest-numbered free block first.

It shows what a new policy has to write: the nine methods of the basic protocol
(:class:`~policies.kv_allocator.BasicAllocator`). Everything else, the lockstep
protocol included, comes from :class:`~policies.kv_allocator.KVAllocator`'s defaults:
the engine steps one iteration at a time and asks each sequence for its slot, which is
correct, only slower than the tuned ``PagedAllocator``. There is no swap space (a
preempted group is recomputed, or aborted if it has several sequences) and no prefix
cache. ``tests/policies/test_example_policy.py`` runs it in the engine against the
reference engine.

The policy differs from vLLM's only in *which* free block it takes (the lowest number,
kept in a heap, instead of the most recently freed): block numbers are not observable
in any result, so every number must come out the same as the reference's.
"""

from __future__ import annotations

import heapq
from collections.abc import Hashable, Sequence

from kvsim.policies.kv_allocator import Admission, KVAllocator, MemoryUsage, final_lengths


class FirstFitPagedAllocator(KVAllocator):
    """``num_blocks`` GPU blocks of ``block_size`` token slots; forks share blocks by
    reference count, and the first append to a shared, partly filled last block copies it."""

    shares_memory = True

    def __init__(self, num_blocks: int, block_size: int):
        self.block_size = block_size
        self.capacity = num_blocks * block_size
        self.num_blocks = num_blocks
        self.free_blocks = list(range(num_blocks))  # a heap: the lowest number first
        self.holders = [0] * num_blocks  # sequences holding each block
        self.tables: dict[int, list[int]] = {}  # resident sequence -> its blocks
        self.kv: dict[int, int] = {}  # sequence -> tokens stored
        self.final: dict[int, int] = {}  # sequence -> tokens it will finally store
        self.copied_blocks = 0

    def _take(self) -> int:
        block = heapq.heappop(self.free_blocks)
        self.holders[block] = 1
        return block

    def _release(self, block: int) -> None:
        self.holders[block] -= 1
        if not self.holders[block]:
            heapq.heappush(self.free_blocks, block)

    def _blocks(self, tokens: int) -> int:
        return -(-tokens // self.block_size)

    def _next_needs_block(self, s: int) -> bool:
        """The next token needs a block: the last one is full, or shared (then it is copied)."""
        return self.kv[s] % self.block_size == 0 or self.holders[self.tables[s][-1]] > 1

    # --- the basic protocol ---------------------------------------------------------------
    def check_admit(self, prompt_len: int, final_len: int | Sequence[int], num_seqs: int,
                    watermark_slots: int, prefix: Sequence[Hashable] = ()) -> Admission:
        watermark = watermark_slots // self.block_size
        prompt = self._blocks(prompt_len)
        longest = self._blocks(max(*final_lengths(final_len, num_seqs), prompt_len))
        # At its peak each sequence holds the shared prompt, its own blocks past it, and
        # (several sequences) its own copy of a partly filled last prompt block.
        copies = num_seqs if num_seqs > 1 and prompt_len % self.block_size else 0
        if prompt > self.num_blocks - watermark or prompt + num_seqs * (longest - prompt) + copies > self.num_blocks:
            return Admission.NEVER
        return Admission.OK if len(self.free_blocks) - prompt >= watermark else Admission.NO_SPACE

    def admit(self, seq_ids: Sequence[int], prompt_len: int, final_len: int | Sequence[int],
              prefix: Sequence[Hashable] = ()) -> int:
        blocks = [self._take() for _ in range(self._blocks(prompt_len))]
        for b in blocks:  # every further sequence holds the prompt too
            self.holders[b] += len(seq_ids) - 1
        for s, final in zip(seq_ids, final_lengths(final_len, len(seq_ids))):
            self.tables[s], self.kv[s], self.final[s] = list(blocks), prompt_len, final
        return 0  # no prefix cache: nothing was found

    def try_append(self, seq_ids: Sequence[int]) -> bool:
        if sum(map(self._next_needs_block, seq_ids)) > len(self.free_blocks):
            return False
        for s in seq_ids:
            table = self.tables[s]
            if self.kv[s] % self.block_size == 0:
                table.append(self._take())
            elif self.holders[table[-1]] > 1:  # copy-on-write
                self._release(table[-1])
                table[-1] = self._take()
                self.copied_blocks += 1
            self.kv[s] += 1
            self.final[s] = max(self.final[s], self.kv[s])
        return True

    def fork(self, parent: int, child: int, child_final_len: int) -> None:
        for b in self.tables[parent]:
            self.holders[b] += 1
        self.tables[child] = list(self.tables[parent])
        self.kv[child], self.final[child] = self.kv[parent], child_final_len

    def free(self, seq_id: int) -> None:
        for b in self.tables.pop(seq_id):
            self._release(b)
        del self.kv[seq_id], self.final[seq_id]

    def resident(self) -> list[int]:
        return list(self.tables)

    def kv_len(self, seq_id: int) -> int:
        return self.kv[seq_id]

    def usage(self) -> MemoryUsage:
        """Tokens in held blocks (a shared block once); a sequence's reservation is its own
        last block's empty slots up to its final length (a shared one will be copied)."""
        B = self.block_size
        held = {b for table in self.tables.values() for b in table}
        full_of = {b: B for b in held}  # every block but a sequence's last is full
        reserved = 0
        for s, table in self.tables.items():
            full_of[table[-1]] = self.kv[s] - (len(table) - 1) * B
            if self.holders[table[-1]] == 1:
                reserved += max(0, min(len(table) * B, self.final[s]) - self.kv[s])
        token_states = sum(full_of.values())
        free = len(self.free_blocks) * B
        unshared = sum(map(len, self.tables.values())) * B
        return MemoryUsage(self.capacity, token_states, reserved,
                           self.capacity - free - token_states - reserved, free, unshared)

    def check(self) -> None:
        holders = [0] * self.num_blocks
        for s, table in self.tables.items():
            assert len(table) == self._blocks(self.kv[s]), f"seq {s}: table length"
            for b in table:
                holders[b] += 1
        assert holders == self.holders, "reference counts are not exact"
        assert sorted(self.free_blocks) == [b for b in range(self.num_blocks) if not holders[b]]
        self.usage().check()
