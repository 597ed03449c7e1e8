"""The reference memory layer (the oracle), written to be read: paged, contiguous and radix
allocation, eviction orders and one cache tier. It never imports the fast memory layer."""
