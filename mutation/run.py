"""Run mutmut over kvsim's core and print the mutation score and the surviving mutants.

``make mutate`` calls this from the repository root. mutmut (configured in
pyproject.toml, ``[tool.mutmut]``) copies the sources to ``mutants/``, makes one
mutant per small change (an operator, a constant, a condition), runs the tests
that cover the mutated function (found once per campaign by tracing the test
selection) and records whether they failed (*killed*) or passed (*survived*).
Results are cached in ``mutants/``: a second run only checks mutants of changed
functions.

The score counts killed (and timed-out) mutants over all mutants checked, less
those listed in ``mutation/equivalent.md`` (mutants no test can kill because they
do not change behaviour; each with why). A survivor not listed there is a missing
test. Usage::

    python mutation/run.py [PATTERN ...] [--jobs N] [--min-score 90] [--report-only]
                           [--skip-tests EXPR]

PATTERN is a mutant name glob, e.g. ``'kvsim.policies.ledger.block_pool*'`` (one module) or
``'kvsim.simulator.sched.scheduler.xǁSchedulerǁ_swap_in*'`` (one method); none means all.
Exit status 1 when the score is below ``--min-score`` (percent).
"""

from __future__ import annotations

import argparse
import fnmatch
import os
import re
import subprocess
import sys
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
EQUIVALENT_FILE = HERE / "equivalent.md"
KILLED = {"killed", "timeout", "segfault", "caught by type check"}  # a test (or the clock) noticed
SURVIVED = {"survived", "no tests", "suspicious"}  # nothing noticed ("no tests": no test reaches it)
NAME = re.compile(r"`([A-Za-z_][\w.ǁ]*__mutmut_\d+)`")  # a mutant's name in backticks


@dataclass
class ModuleScore:
    """Mutant counts of one module; ``score`` is a percentage of the non-equivalent mutants checked."""

    statuses: Counter = field(default_factory=Counter)
    equivalent: int = 0
    survivors: list[str] = field(default_factory=list)

    @property
    def killed(self) -> int:
        return sum(self.statuses[s] for s in KILLED)

    @property
    def checked(self) -> int:
        """Mutants with a verdict, less the equivalent ones."""
        return self.killed + len(self.survivors)

    @property
    def score(self) -> float:
        return 100.0 * self.killed / self.checked if self.checked else float("nan")


def mutmut(*args: str) -> list[str]:
    """The venv's mutmut (next to this Python), as a command line."""
    exe = Path(sys.executable).with_name("mutmut")
    return [str(exe) if exe.exists() else "mutmut", *args]


def equivalent_mutants(path: Path = EQUIVALENT_FILE) -> set[str]:
    """Names of the mutants judged equivalent: every backticked mutant name in the file."""
    if not path.exists():
        return set()
    return set(NAME.findall(path.read_text(encoding="utf-8")))


def results() -> dict[str, str]:
    """Every mutant's status, from mutmut's cache (``mutmut results --all true``)."""
    out = subprocess.run(mutmut("results", "--all", "true"), capture_output=True, text=True, check=True).stdout
    statuses = {}
    for line in out.splitlines():
        name, sep, status = line.strip().rpartition(": ")
        if sep and "__mutmut_" in name:
            statuses[name] = status
    return statuses


def module_of(name: str) -> str:
    """``kvsim.policies.ledger.block_pool.xǁBlockPoolǁcheck__mutmut_3`` -> ``kvsim.policies.ledger.block_pool``."""
    return name.split(".x_")[0].split(".xǁ")[0]


def natural(name: str) -> tuple[str, int]:
    """Sort key: ``f__mutmut_9`` before ``f__mutmut_10``."""
    base, _, number = name.rpartition("__mutmut_")
    return base, int(number) if number.isdigit() else 0


def score(statuses: dict[str, str], patterns: list[str], equivalent: set[str]) -> dict[str, ModuleScore]:
    by_module: dict[str, ModuleScore] = defaultdict(ModuleScore)
    for name, status in sorted(statuses.items(), key=lambda kv: natural(kv[0])):
        if patterns and not any(fnmatch.fnmatch(name, p) for p in patterns):
            continue
        m = by_module[module_of(name)]
        m.statuses[status] += 1
        if status in SURVIVED:
            if name in equivalent:
                m.equivalent += 1
            else:
                m.survivors.append(name)
    return dict(by_module)


def changed_lines(name: str) -> str:
    """The mutant's diff, only its changed lines."""
    diff = subprocess.run(mutmut("show", name), capture_output=True, text=True).stdout
    return " | ".join(line for line in diff.splitlines() if line[:2] in ("- ", "+ "))


def report(by_module: dict[str, ModuleScore], show_diffs: int) -> float:
    """Print the table and the survivors; return the overall score (percent)."""
    total = ModuleScore()
    print(f"{'module':32} {'mutants':>8} {'killed':>7} {'survived':>9} {'equiv.':>7} {'unchecked':>10} {'score':>7}")
    for module, m in sorted(by_module.items()):
        unchecked = m.statuses["not checked"] + m.statuses["skipped"]
        print(f"{module:32} {sum(m.statuses.values()):8} {m.killed:7} {len(m.survivors):9} {m.equivalent:7} "
              f"{unchecked:10} {m.score:6.1f}%")
        total.statuses.update(m.statuses)
        total.equivalent += m.equivalent
        total.survivors += m.survivors
    print(f"{'all':32} {sum(total.statuses.values()):8} {total.killed:7} {len(total.survivors):9} "
          f"{total.equivalent:7} {total.statuses['not checked'] + total.statuses['skipped']:10} {total.score:6.1f}%")
    if total.survivors:
        print(f"\nSurviving mutants ({len(total.survivors)}; `mutmut show NAME` for the diff; list equivalent "
              f"ones with why in {EQUIVALENT_FILE.relative_to(HERE.parent)}):")
        for i, name in enumerate(total.survivors):
            print(f"  {name}" + (f"\n      {changed_lines(name)}" if i < show_diffs else ""))
    return total.score


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("patterns", nargs="*", help="mutant name globs, e.g. 'kvsim.policies.ledger.block_pool*' (default: all)")
    ap.add_argument("--jobs", type=int, default=int(os.environ.get("MUTATE_JOBS", os.cpu_count() or 2)),
                    help="mutants checked in parallel (default: MUTATE_JOBS or the CPU count)")
    ap.add_argument("--min-score", type=float, default=90.0, help="exit 1 below this score (percent)")
    ap.add_argument("--report-only", action="store_true", help="do not run mutmut; report its cached results")
    ap.add_argument("--show-diffs", type=int, default=40, help="print the changed lines of this many survivors")
    ap.add_argument("--skip-tests", metavar="EXPR",
                    help="pytest -k expression of tests to leave out, e.g. 'v1' while someone's "
                         "half-finished tests fail (mutmut stops when the unmutated code fails a test)")
    args = ap.parse_args(argv)
    if not args.report_only:
        env = dict(os.environ)
        if args.skip_tests:  # pytest reads PYTEST_ADDOPTS in mutmut's runs too
            env["PYTEST_ADDOPTS"] = f"{env.get('PYTEST_ADDOPTS', '')} -k 'not ({args.skip_tests})'".strip()
        t0 = time.monotonic()
        subprocess.run(mutmut("run", "--max-children", str(args.jobs), *args.patterns), check=True, env=env)
        print(f"\nmutmut run took {time.monotonic() - t0:.0f} s with {args.jobs} parallel jobs")
    by_module = score(results(), args.patterns, equivalent_mutants())
    if not by_module:
        print(f"no mutants match {args.patterns}", file=sys.stderr)
        return 1
    overall = report(by_module, args.show_diffs)
    if not overall >= args.min_score:
        print(f"\nmutation score {overall:.1f}% is below {args.min_score:g}%", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
