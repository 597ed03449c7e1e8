"""The engine, schedulers, cost models, metrics and command line of kvsim (``kvsim.simulator``)."""

if __name__ != "kvsim.simulator":  # one module object per file: never both simulator.x and kvsim.simulator.x
    raise ImportError(f"import kvsim.simulator, not {__name__}: the repository's folders install as the kvsim package")
