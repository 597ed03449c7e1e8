"""Side-by-side bench: the same ``make bench`` cases at an old revision and at this tree.

Why: a speed claim ("no slower than before, +-5%") only holds when both commits run on one
machine in one sitting, so that load from other processes hits both alike. This runs each case
in the old tree and in each new tree in turn (the order rotated every repeat), each run in its
own process, and reports the least wall time of the repeats (the least disturbed run), the
least CPU time (``time.process_time``: less moved by other processes on a machine with few
cores, though hyperthreads and caches still share), and the spread ``(median - min) / min``
of the wall times as the noise.

Each side runs its *own* ``benchmarks/run.py`` (``CASES`` and ``run_case``), so a case means
what it meant at that commit. Where the two commits' configs differ (a default changed, a key
renamed), ``--old-set`` / ``--new-set`` patch a case's config before it runs, as
``CASE:dotted.key=value`` (``*`` for every case; the value is read as YAML). The harness checks
that both sides then did the same work (same iterations, engine rows and completed requests)
and marks a case whose work differs, since its times are not comparable.

Usage (from the repository root)::

    python -m benchmarks.compare fa06fac --cases a,b,c,d10k,d100k --repeats 5 \\
        --new-set '*:cost_model.efficiencies=hand-picked' --old-set 'c:hardware.kv_cache_gb=13.52'

``OLD`` is a revision (checked out into a temporary ``git worktree``, removed afterwards) or
the path of a tree already checked out; ``--new-tree DIR`` (repeatable) times other checked-out
trees instead of this one, in the same sitting (e.g. before and after a change).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# Runs in the child, inside one tree: that tree's benchmark cases and runner, a patched config.
_CHILD = """
import importlib, json, os, sys, time
sys.path.insert(0, '.')
import yaml
import benchmarks.run as bench
# Imported before the CPU clock starts (run_case imports them; older trees lack kvsim/).
package = 'kvsim.simulator' if os.path.isdir('kvsim') else 'simulator'
for module in ('config', 'runner'):
    importlib.import_module(f'{package}.{module}')
name, overrides = sys.argv[1], json.loads(sys.argv[2])
raw = bench.CASES[name][1]
for dotted, text in overrides:
    *parents, leaf = dotted.split('.')
    node = raw
    for key in parents:
        node = node.setdefault(key, {})
    node[leaf] = yaml.safe_load(text)
cpu = time.process_time()
result = bench.run_case(name, True)
result['cpu_s'] = time.process_time() - cpu  # with the config's validation (milliseconds)
print(json.dumps(result))
"""

WORK_KEYS = ("iterations", "rows", "completed")
"""What both sides must agree on for their times to be comparable (the same simulated work)."""


@dataclass
class Side:
    """One tree's runs of one case: wall and CPU seconds per repeat and the work it reported."""

    walls_s: list[float] = field(default_factory=list)
    cpus_s: list[float] = field(default_factory=list)
    work: dict[str, int] = field(default_factory=dict)

    @property
    def best_s(self) -> float:
        return min(self.walls_s)

    @property
    def best_cpu_s(self) -> float:
        """The least CPU time: less moved than wall time by other processes on few cores."""
        return min(self.cpus_s)

    @property
    def noise(self) -> float:
        """(median - min) / min: how much the other load on the machine moved this side."""
        return statistics.median(self.walls_s) / self.best_s - 1


def parse_overrides(items: list[str], option: str) -> list[tuple[str, str, str]]:
    """``CASE:dotted.key=value`` -> (case, dotted key, value text); a malformed one is an error."""
    out = []
    for item in items:
        case, sep, rest = item.partition(":")
        key, eq, value = rest.partition("=")
        if not sep or not eq or not case or not key:
            raise SystemExit(f"{option} {item!r}: expected CASE:dotted.key=value (CASE may be *)")
        out.append((case, key, value))
    return out


def run_once(tree: Path, case: str, overrides: list[tuple[str, str, str]]) -> dict:
    """Run ``case`` in ``tree`` in a fresh process; return that tree's ``run_case`` dict."""
    mine = [(key, value) for c, key, value in overrides if c in ("*", case)]
    proc = subprocess.run([sys.executable, "-c", _CHILD, case, json.dumps(mine)], cwd=tree,
                          capture_output=True, text=True)
    if proc.returncode != 0:
        tail = proc.stderr.strip().splitlines()[-1:] or ["(no message)"]
        raise SystemExit(f"case {case} failed in {tree}: {tail[0]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def compare(old: Path, news: list[Path], cases: list[str], repeats: int,
            old_set: list[tuple[str, str, str]], new_set: list[tuple[str, str, str]]) -> str:
    """Time every case ``repeats`` times in the old tree and in each new one, in turn (the
    order rotated every repeat, so no tree always runs first); return a Markdown table with
    a row per case and new tree."""
    lines = ["| case | new tree | old s | new s | change | CPU old s | CPU new s | CPU change "
             "| noise old / new | same work |", "|" + " --- |" * 10]
    trees = [("old", old, old_set)] + [(f"new{i}", tree, new_set) for i, tree in enumerate(news, 1)]
    for case in cases:
        sides = {label: Side() for label, _, _ in trees}
        for r in range(repeats):
            shift = r % len(trees)
            for label, tree, sets in trees[shift:] + trees[:shift]:
                result = run_once(tree, case, sets)
                sides[label].walls_s.append(result["wall_s"])
                sides[label].cpus_s.append(result["cpu_s"])
                sides[label].work = {k: result[k] for k in WORK_KEYS}
                print(f"{case} {label} #{r + 1}: {result['wall_s']:.3f} s", file=sys.stderr)
        o = sides["old"]
        for label, tree, _ in trees[1:]:
            n = sides[label]
            same = "yes" if o.work == n.work else f"NO: old {o.work}, new {n.work}"
            lines.append(f"| {case} | {tree} | {o.best_s:.3f} | {n.best_s:.3f} | "
                         f"{(n.best_s / o.best_s - 1) * 100:+.1f}% | {o.best_cpu_s:.3f} | "
                         f"{n.best_cpu_s:.3f} | {(n.best_cpu_s / o.best_cpu_s - 1) * 100:+.1f}% | "
                         f"{o.noise * 100:.1f}% / {n.noise * 100:.1f}% | {same} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("old", help="old revision (a git worktree is made) or a checked-out tree")
    p.add_argument("--cases", default="a,b,c,d10k,d100k", help="comma-separated bench cases")
    p.add_argument("--repeats", type=int, default=5, help="runs per side and case (min is kept)")
    p.add_argument("--old-set", action="append", default=[], metavar="CASE:KEY=VALUE")
    p.add_argument("--new-set", action="append", default=[], metavar="CASE:KEY=VALUE")
    p.add_argument("--new-tree", type=Path, action="append", default=[],
                   help="a new side's checked-out tree (repeatable; default: this one)")
    args = p.parse_args(argv)
    if args.repeats < 1:
        p.error(f"--repeats {args.repeats}: expected at least 1")
    cases = [c.strip() for c in args.cases.split(",") if c.strip()]
    old_set = parse_overrides(args.old_set, "--old-set")
    new_set = parse_overrides(args.new_set, "--new-set")
    news = [t.resolve() for t in args.new_tree] or [ROOT]
    if Path(args.old).is_dir():
        print(compare(Path(args.old).resolve(), news, cases, args.repeats, old_set, new_set))
        return 0
    with tempfile.TemporaryDirectory(prefix="kvsim-bench-old-") as tmp:
        tree = Path(tmp) / "tree"
        subprocess.run(["git", "worktree", "add", "--detach", str(tree), args.old], cwd=ROOT,
                       check=True, capture_output=True)
        try:
            print(compare(tree, news, cases, args.repeats, old_set, new_set))
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=ROOT,
                           check=True, capture_output=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
