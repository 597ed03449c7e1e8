"""Cache tiers below the GPU pool: one bounded tier (``cache_tier``) and the stack of them a
replica reads and writes through (``tier_stack``)."""
