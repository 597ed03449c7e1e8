"""The fast engine: SimPy processes (``simulation``), the shortcuts that keep it fast
(``fast_path``: runs of identical decode steps as one event), what it records (``metrics``,
``step_log``, ``memory_classes``) and the runner that wires a config to a finished run."""
