"""What a user runs: the command line (``cli``), sweeps and where they execute, plots,
``kvsim validate`` and ``kvsim reproduce``, experiments that build the README's tables."""
