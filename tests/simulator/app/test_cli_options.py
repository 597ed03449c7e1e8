"""One parser for each CLI option: an option that several ``kvsim`` commands take (the
sweep executor's ``--executor``, ``--address``, ``--workers``, ``--no-progress``; ``--set``)
is defined once and means the same everywhere, so its help, type, choices and default
cannot drift apart between commands."""

from __future__ import annotations

import argparse
from collections import defaultdict

import pytest

from kvsim.simulator.app.cli import build_parser, main

# Options whose help names the command's own scope or default (which runs a --set reaches,
# where --out writes, which figures --no-plot skips); everything else about them must agree.
SCOPED_HELP = {"--set", "--out", "--no-plot"}
# Options whose default is the command's own (each command writes to its own folder).
SCOPED_DEFAULT = {"--out"}


def _commands(parser: argparse.ArgumentParser, prefix: str = "") -> dict[str, argparse.ArgumentParser]:
    """Every leaf command's parser by its name (``trace stats`` included)."""
    found = {}
    for action in parser._actions:  # argparse exposes subcommands only here
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found.update(_commands(sub, f"{prefix}{name} ") or {f"{prefix}{name}": sub})
    return found


def _definitions() -> dict[str, list[tuple[str, argparse.Action]]]:
    """Each option string -> the (command, action) pairs that define it."""
    by_option = defaultdict(list)
    for command, parser in _commands(build_parser()).items():
        for action in parser._actions:
            for option in action.option_strings:
                if option.startswith("--") and option != "--help":
                    by_option[option].append((command, action))
    return by_option


def _signature(option: str, action: argparse.Action) -> tuple:
    return (
        type(action).__name__,
        action.dest,
        action.type,
        tuple(action.choices) if action.choices else None,
        action.metavar,
        None if option in SCOPED_DEFAULT else action.default,
        None if option in SCOPED_HELP else action.help,
    )


def test_the_walk_finds_every_command():
    assert {"run", "sweep", "reproduce", "validate", "plot", "trace stats", "trace plot",
            "calibrate"} <= set(_commands(build_parser()))


def test_an_option_shared_by_commands_means_the_same_in_each():
    defs = _definitions()
    shared = {o: d for o, d in defs.items() if len(d) > 1}
    assert {"--executor", "--address", "--workers", "--no-progress", "--set"} <= set(shared)
    for option, places in shared.items():
        signatures = {command: _signature(option, action) for command, action in places}
        assert len(set(signatures.values())) == 1, (option, signatures)


@pytest.mark.parametrize("command", ["sweep", "reproduce"])
def test_an_address_without_ray_is_one_error_line_in_both_executor_commands(command, capsys):
    """Checked before anything is read or run: the file need not exist."""
    target = {"sweep": "no-such-sweep.yaml", "reproduce": "vllm-paper"}[command]
    assert main([command, target, "--address", "ray://h:10001"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--address ray://h:10001" in err and "--executor ray" in err
