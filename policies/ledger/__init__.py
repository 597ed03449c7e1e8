"""Where KV lives: a pool of blocks with reference counts (``block_pool``), paged allocation
with block tables, copy-on-write and swap (``paged_allocator``, ``v1_prefix_cache``), and
contiguous allocation in a space of slots (``contiguous_allocator``, ``slot_space``,
``reservation``)."""
