"""``make bench`` (profile loading): how long an imported operator profile takes to load.

An imported profile (``kvsim calibrate --import`` of an LLMServingSim bundle) is about 1.1 MB
of YAML. Each way of loading it runs in a fresh process (nothing cached in memory), timed
around the load alone (imports excluded), best of ``--repeat``:

- ``yaml (libyaml)``: the YAML parsed with PyYAML's C loader and checked, as kvsim read every
  profile before the binary copy (``simulator.cost_model.profile_cache``);
- ``yaml (pure Python)``: the same with PyYAML's Python loader, what a PyYAML without libyaml
  does;
- ``binary copy``: ``read_operator_profile`` with the copy the importer left beside the
  profile (the way kvsim loads it now);
- ``binary copy + cost model``: the same, then the profiled cost model built on it (what a
  run pays before its first step);
- the shipped RTX 4090 profile (125 kB of YAML, no copy) for reference.

Usage: ``python -m benchmarks.profile_load [--bundle DIR] [--repeat N]``; the default bundle is
the RTX PRO 6000 Llama-3.1-8B one in ``../shared/validation/profiles-rtxpro6000`` (skipped,
saying so, when it is not there).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_BUNDLE = ROOT.parent / "shared" / "validation" / "profiles-rtxpro6000" / "llama-3.1-8b"
WAYS = ("yaml-c", "yaml-py", "copy", "copy+model", "shipped")
LABELS = {"yaml-c": "yaml (libyaml)", "yaml-py": "yaml (pure Python)", "copy": "binary copy",
          "copy+model": "binary copy + cost model", "shipped": "shipped rtx4090 profile (125 kB yaml)"}


def load_once(way: str, path: str) -> float:
    """Seconds to load ``path`` one ``way`` (in this process, nothing cached yet)."""
    import yaml

    from kvsim.simulator.cost_model import operator_profile as op

    if way in ("yaml-c", "yaml-py"):
        loader = yaml.CSafeLoader if way == "yaml-c" else yaml.SafeLoader
        t0 = time.perf_counter()
        op._Reader(path).profile(yaml.load(Path(path).read_text(), Loader=loader))
        return time.perf_counter() - t0
    if way == "copy+model":
        from kvsim.simulator.cost_model.base import Deployment
        from kvsim.simulator.cost_model.catalogue import GPUS, MODELS
        from kvsim.simulator.cost_model.profiled import ProfiledCostModel

        t0 = time.perf_counter()
        ProfiledCostModel(op.read_operator_profile(path), Deployment(MODELS["llama-3.1-8b"], GPUS["rtx-pro-6000"]))
        return time.perf_counter() - t0
    t0 = time.perf_counter()
    op.read_operator_profile(path)
    return time.perf_counter() - t0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--bundle", default=str(DEFAULT_BUNDLE), help="an LLMServingSim profile bundle folder")
    p.add_argument("--repeat", type=int, default=3, help="fresh processes per way (the best is shown)")
    p.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        print(json.dumps(load_once(*args.child)))
        return 0
    if not Path(args.bundle, "meta.yaml").is_file():
        print(f"profile load benchmark skipped: no bundle at {args.bundle}")
        return 0
    from kvsim.simulator.cost_model.operator_profile import PROFILES_DIR
    from kvsim.simulator.cost_model.profile_import import import_bundle

    with tempfile.TemporaryDirectory() as tmp:
        path = import_bundle(args.bundle, tmp)  # leaves the binary copy beside the profile
        print(f"profile: {path.name}, {path.stat().st_size / 1e6:.2f} MB of YAML")
        print(f"| load | seconds (best of {args.repeat} fresh processes) |\n| --- | ---: |")
        for way in WAYS:
            target = str(PROFILES_DIR / "rtx4090-llama-3.1-8b.yaml") if way == "shipped" else str(path)
            best = min(float(subprocess.run([sys.executable, "-m", "benchmarks.profile_load", "--child", way,
                                             target], cwd=ROOT, check=True, capture_output=True,
                                            text=True).stdout.strip().splitlines()[-1])
                       for _ in range(args.repeat))
            print(f"| {LABELS[way]} | {best:.3f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
