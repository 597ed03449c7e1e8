"""How cached KV is found and which goes first: the chained block keys of a prefix
(``key_chain``, ``token_blocks``), vLLM v1's free block queue (``free_block_queue``), eviction
orders (``eviction_order``) and SGLang's radix tree with its own allocation (``radix_cache``)."""
