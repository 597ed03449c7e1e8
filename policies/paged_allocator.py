"""Paged KV allocation (vLLM's PagedAttention): fixed-size blocks, block tables, sharing.

A sequence's KV lives in a list of blocks (its block table); a new block is taken
only when the last one is full, so at most ``block_size - 1`` slots per sequence
are ever allocated ahead of need. Forked sequences share blocks by reference
count; appending to a shared, partly filled last block first copies it
(copy-on-write). Swapping moves a group's distinct blocks to a CPU pool once each,
however many of its sequences share them.
"""

from __future__ import annotations

from collections.abc import Sequence

from policies.block_pool import BlockPool
from policies.kv_allocator import Admission, KVAllocator, MemoryUsage, SwapResult


def blocks_for(tokens: int, block_size: int) -> int:
    """Blocks needed to hold ``tokens`` slots."""
    return -(-tokens // block_size)


class PagedAllocator(KVAllocator):
    """``num_blocks`` GPU blocks and ``swap_blocks`` CPU blocks of ``block_size`` slots."""

    shares_memory = True

    def __init__(self, num_blocks: int, block_size: int, swap_blocks: int = 0):
        self.pool = BlockPool(num_blocks, block_size)
        self.cpu_pool = BlockPool(swap_blocks, block_size)
        self.block_size = block_size
        self.capacity = num_blocks * block_size
        self._tables: dict[int, list[int]] = {}  # seq -> GPU blocks, or CPU blocks while swapped
        self._kv: dict[int, int] = {}  # seq -> tokens of KV stored
        self._final: dict[int, int] = {}  # seq -> final KV length (classification only)
        self._swapped: set[int] = set()
        self._filled = [0] * num_blocks  # slots written in each GPU block
        self._cpu_filled = [0] * swap_blocks
        self._token_states = 0  # sum of _filled over GPU blocks in use
        self.cow_copies = 0  # copy-on-write block copies so far

    # --- admission -------------------------------------------------------------
    def _never_fits(self, prompt_len: int, final_len: int, num_seqs: int, wm_blocks: int) -> bool:
        B = self.block_size
        prompt_blocks = blocks_for(prompt_len, B)
        final_blocks = blocks_for(max(final_len, prompt_len), B)
        if num_seqs == 1:
            peak = final_blocks
        else:  # each sequence copies the shared partial block, then grows on its own
            peak = prompt_blocks + num_seqs * (final_blocks - prompt_blocks + 1)
        return prompt_blocks > self.pool.num_blocks - wm_blocks or peak > self.pool.num_blocks

    def check_admit(self, prompt_len: int, final_len: int, num_seqs: int, watermark_slots: int) -> Admission:
        wm = watermark_slots // self.block_size
        if self._never_fits(prompt_len, final_len, num_seqs, wm):
            return Admission.NEVER
        if self.pool.num_free - blocks_for(prompt_len, self.block_size) < wm:
            return Admission.NO_SPACE
        return Admission.OK

    def admit(self, seq_ids: Sequence[int], prompt_len: int, final_len: int) -> None:
        B = self.block_size
        blocks = self.pool.allocate_many(blocks_for(prompt_len, B))
        filled = self._filled
        for i, b in enumerate(blocks):
            filled[b] = min(B, prompt_len - i * B)
        self._token_states += prompt_len
        for k, s in enumerate(seq_ids):
            if k:
                for b in blocks:
                    self.pool.share(b)
            self._tables[s] = list(blocks)
            self._kv[s] = prompt_len
            self._final[s] = final_len

    # --- growth and sharing ---------------------------------------------------------
    def try_append(self, seq_ids: Sequence[int]) -> bool:
        B = self.block_size
        kv, tables, rc = self._kv, self._tables, self.pool._refcount
        need = 0
        for s in seq_ids:
            if kv[s] % B == 0 or rc[tables[s][-1]] > 1:
                need += 1
        if need > self.pool.num_free:
            return False
        filled, pool = self._filled, self.pool
        for s in seq_ids:
            n = kv[s]
            off = n % B
            table = tables[s]
            if off == 0:
                block = pool.allocate()
                table.append(block)
            else:
                block = table[-1]
                if rc[block] > 1:  # copy-on-write: the partial block is shared
                    copy = pool.allocate()
                    filled[copy] = off
                    self._token_states += off
                    pool.release(block)
                    table[-1] = block = copy
                    self.cow_copies += 1
            filled[block] = off + 1
            kv[s] = n + 1
        self._token_states += len(seq_ids)
        return True

    def fork(self, parent: int, child: int, child_final_len: int) -> None:
        table = self._tables[parent]
        for b in table:
            self.pool.share(b)
        self._tables[child] = list(table)
        self._kv[child] = self._kv[parent]
        self._final[child] = child_final_len

    def free(self, seq_id: int) -> None:
        table = self._tables.pop(seq_id)
        if seq_id in self._swapped:
            self._swapped.discard(seq_id)
            for b in table:
                if self.cpu_pool.release(b):
                    self._cpu_filled[b] = 0
        else:
            self._release_gpu(table)
        del self._kv[seq_id], self._final[seq_id]

    def _release_gpu(self, table: list[int]) -> None:
        filled = self._filled
        for b in table:
            if self.pool.release(b):
                self._token_states -= filled[b]
                filled[b] = 0

    # --- swapping -------------------------------------------------------------------
    def _distinct_blocks(self, seq_ids: Sequence[int]) -> int:
        return len({b for s in seq_ids for b in self._tables[s]})

    def can_swap_out(self, seq_ids: Sequence[int]) -> bool:
        return self._distinct_blocks(seq_ids) <= self.cpu_pool.num_free

    def swap_out(self, seq_ids: Sequence[int]) -> SwapResult:
        moved = self._move(seq_ids, self.pool, self.cpu_pool, self._filled, self._cpu_filled)
        self._swapped.update(seq_ids)
        return moved

    def check_swap_in(self, seq_ids: Sequence[int], watermark_slots: int) -> Admission:
        need = self._distinct_blocks(seq_ids)
        wm = watermark_slots // self.block_size
        if need > self.pool.num_blocks - wm:
            return Admission.NEVER
        if self.pool.num_free - need < wm:
            return Admission.NO_SPACE
        return Admission.OK

    def swap_in(self, seq_ids: Sequence[int]) -> SwapResult:
        moved = self._move(seq_ids, self.cpu_pool, self.pool, self._cpu_filled, self._filled)
        self._swapped.difference_update(seq_ids)
        return moved

    def _move(self, seq_ids, src: BlockPool, dst: BlockPool, src_filled, dst_filled) -> SwapResult:
        """Copy a group's distinct blocks from ``src`` to ``dst``, keeping their sharing."""
        mapping: dict[int, int] = {}
        slots = 0
        to_gpu = dst is self.pool
        for s in seq_ids:
            table = self._tables[s]
            for i, b in enumerate(table):
                new = mapping.get(b)
                if new is None:
                    new = mapping[b] = dst.allocate()
                    dst_filled[new] = src_filled[b]
                    slots += src_filled[b]
                    if to_gpu:
                        self._token_states += src_filled[b]
                else:
                    dst.share(new)
                table[i] = new
                if src.release(b):
                    if not to_gpu:
                        self._token_states -= src_filled[b]
                    src_filled[b] = 0
        return SwapResult(blocks=len(mapping), slots=slots)

    # --- observation -----------------------------------------------------------------
    def kv_len(self, seq_id: int) -> int:
        return self._kv[seq_id]

    def free_slots(self) -> int:
        return self.pool.num_free * self.block_size

    def usage(self) -> MemoryUsage:
        B = self.block_size
        rc = self.pool._refcount
        reserved = 0
        for s, table in self._tables.items():
            # Only an exclusively held last block will be filled by this sequence itself.
            if table and s not in self._swapped and rc[table[-1]] == 1:
                ahead = min(len(table) * B, self._final[s]) - self._kv[s]
                if ahead > 0:
                    reserved += ahead
        allocated = self.pool.num_used * B
        return MemoryUsage(
            capacity=self.capacity,
            token_states=self._token_states,
            reserved=reserved,
            internal_frag=allocated - self._token_states - reserved,
            free=self.pool.num_free * B,
        )

    def check(self) -> None:
        self.pool.check()
        self.cpu_pool.check()
        gpu_refs = [0] * self.pool.num_blocks
        cpu_refs = [0] * self.cpu_pool.num_blocks
        for s, table in self._tables.items():
            refs = cpu_refs if s in self._swapped else gpu_refs
            for b in table:
                refs[b] += 1
            assert blocks_for(self._kv[s], self.block_size) == len(table), f"seq {s}: table length"
        for b in range(self.pool.num_blocks):
            assert gpu_refs[b] == self.pool.refcount(b), f"GPU block {b}: refcount is not exact"
        for b in range(self.cpu_pool.num_blocks):
            assert cpu_refs[b] == self.cpu_pool.refcount(b), f"CPU block {b}: refcount is not exact"
        in_use = sum(self._filled[b] for b in range(self.pool.num_blocks) if gpu_refs[b])
        assert in_use == self._token_states, "token_states drifted from the blocks' contents"
        self.usage().check()
