"""Scheduling rules, one module per modelled engine: vLLM v0 (``scheduler``), vLLM v1
(``vllm_v1``), SGLang (``sglang``), what the last two share (``one_sequence``), a request in
flight (``sequence``), the wait for a tier load (``tier_loads``) and the registry that binds
each ``scheduler.policy`` to its scheduler and cache (``policy_registry``)."""
