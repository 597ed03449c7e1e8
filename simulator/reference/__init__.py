"""The reference engine (the oracle): vLLM's rules (``vllm``) and SGLang's (``sglang``), one
plain SimPy step per iteration, and the simulation that runs them (``simulation``). It never
imports the fast engine, its schedulers or the fast memory layer (import contract)."""
