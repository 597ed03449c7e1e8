"""`kvsim reproduce vllm-paper --quick`, one figure: the orderings that hold by construction."""

from simulator.reproduce import EXPERIMENTS, run_experiments, swap_microbenchmark, write_report


def test_quick_fig2_orders_systems_and_writes_report(tmp_path):
    results = run_experiments(tmp_path, quick=True, executor="local", workers=1, only=("fig2",),
                              progress=False, log=lambda _: None)
    table = results["fig2"].table.set_index("system")
    assert (table["status"] == "ok").all()
    share = table["mem_token_states_perc"]
    assert share["Orca-Max"] < share["Orca-Pow2"] < share["Orca-Oracle"] < share["vLLM"]
    batched = table["mean_batched_requests"]
    assert batched["vLLM"] > batched["Orca-Oracle"]  # same load, less waste -> bigger batches
    report = write_report(results, tmp_path, quick=True)
    text = report.read_text()
    assert "## Fig. 2: memory breakdown" in text and "**agrees**" in text
    assert (tmp_path / "figures" / "fig2_memory_breakdown.png").stat().st_size > 10_000


def test_every_experiment_has_a_sweep_file_and_section():
    from simulator.reproduce import CONFIG_DIR, SECTIONS

    for e in EXPERIMENTS:
        assert (CONFIG_DIR / e.sweep).is_file(), e.sweep
        assert e.key in SECTIONS


def test_swap_microbenchmark_small_blocks_are_slow_to_swap():
    micro = swap_microbenchmark(tokens=2048)
    swap = micro["swap_out_and_in_ms"].to_numpy()
    assert (swap[:-1] > swap[1:]).all()  # fewer, larger transfers as blocks grow
    assert micro["recompute_ms"].nunique() == 1  # recomputation does not depend on the block size
    assert swap[0] > micro["recompute_ms"].iloc[0]  # block size 1: swapping is the slower way
