"""KV-cache allocators and preemption policies: pure data structures, no simulator imports."""

from policies.block_pool import BlockPool, OutOfBlocks

__all__ = ["BlockPool", "OutOfBlocks"]
