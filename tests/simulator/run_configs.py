"""Config dicts for a whole run of a cost model in the simulator tests: one model on one GPU
serving Poisson arrivals with the paper's ShareGPT lengths (``sharegpt-paper``). The tests
of the profiled, the Vidur-imported and the preset roofline cost models run the same shape
of experiment and differ only in what is passed here."""

from __future__ import annotations

from pathlib import Path

#: a quickstart-named experiment of five tiny requests (the CLI output and write-rule tests)
TINY = {
    "name": "quickstart",
    "seed": 0,
    "model": {"name": "llama-2-7b"},
    "workload": {"arrivals": {"kind": "poisson", "rate": 5.0},
                 "lengths": {"kind": "fixed", "prompt_tokens": 32, "output_tokens": 8}, "num_requests": 5},
}


def sharegpt_config(tmp_path: Path, *, name: str, model: str, gpu: str, rate: float,
                    num_requests: int, cost_model: dict, scheduler: dict | None = None,
                    context_len_tokens: int = 4096) -> dict:
    """A raw experiment config (as read from YAML) writing its output under ``tmp_path``:
    ``rate`` requests a second, ``num_requests`` of them; ``scheduler`` is left out when
    None (the scheduler's defaults)."""
    config = {
        "name": name,
        "model": {"name": model, "context_len_tokens": context_len_tokens},
        "hardware": {"gpu": gpu},
        "workload": {"arrivals": {"kind": "poisson", "rate": rate},
                     "lengths": {"kind": "preset", "name": "sharegpt-paper"},
                     "num_requests": num_requests},
    }
    if scheduler is not None:
        config["scheduler"] = scheduler
    return {**config, "cost_model": cost_model, "output_dir": str(tmp_path)}
