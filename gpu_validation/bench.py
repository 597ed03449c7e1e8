"""``kvsim calibrate`` / ``python -m kvsim.gpu_validation.bench``: measure a GPU, write its profile.

Steps: correctness checks at full size (kernels vs the torch reference, copy and swap
round trips), then timing grids (decode attention paged vs contiguous over batch x
context x block size, GEMMs at the catalogue models' shapes, prefill attention, block
copy, swap per block and batched), then least-squares fits. Writes to ``--out``
(default ``gpu_validation/profiles/``):

- ``<gpu-slug>.yaml``: the profile (format: ``simulator.cost_model.calibration_profile``);
- ``<gpu-slug>_raw.csv``: every measurement (rewritten after each section, so a run cut
  short still leaves its data);
- ``<gpu-slug>_summary.json``: the headline numbers (see ``gpu_validation.report``).

Without a CUDA GPU it prints one line and exits with code 2. The whole run keeps to
``--budget-s`` seconds (default 360): each grid stops at its share of the budget and the
profile notes which were cut. ``--refit PROFILE`` refits a profile from its raw CSV
without a GPU.
"""

from __future__ import annotations

import argparse
import csv
import datetime as dt
import json
import os
import re
import subprocess
import sys
import time
import traceback
from dataclasses import replace
from pathlib import Path

DEFAULT_OUT = Path("results") / "profiles"  # in the working directory, as `kvsim calibrate --import`

# Seconds each section may take at most (they add up to the default budget).
SECTION_SECONDS = {
    "correctness": 60,
    "tune": 35,
    "decode": 110,
    "gemm": 60,
    "prefill": 20,
    "pool": 75,
}
NO_GPU_MESSAGE = (
    "kvsim calibrate: no CUDA GPU visible to torch; calibration measures a real GPU. "
    "Without one, use the example profile gpu_validation/profiles/example-a100-80gb.yaml."
)


def gpu_slug(name: str) -> str:
    """``"NVIDIA H200"`` -> ``"nvidia-h200"``."""
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-") or "gpu"


def write_rows(rows: list[dict], path: Path) -> None:
    fields: dict[str, None] = {}
    for r in rows:
        fields.update(dict.fromkeys(r))
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(fields), restval="")
        w.writeheader()
        w.writerows(rows)


def _parse_cell(s: str):
    for cast in (int, float):
        try:
            return cast(s)
        except ValueError:
            pass
    return s


def read_rows(path: Path) -> list[dict]:
    """Rows of a raw CSV with numbers parsed back and empty cells dropped."""
    with path.open(newline="") as f:
        return [{k: _parse_cell(v) for k, v in r.items() if v != ""} for r in csv.DictReader(f)]


def _driver_version() -> str:
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=10,
        )
        return (
            out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else ""
        )
    except (OSError, subprocess.SubprocessError):
        return ""


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    if argv and argv[0] == "--":  # `kvsim calibrate -- --quick` hands the separator on
        argv = argv[1:]
    p = argparse.ArgumentParser(prog="kvsim calibrate", description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--out", type=Path, default=DEFAULT_OUT,
        help=f"directory for the profile, CSV and summary (default {DEFAULT_OUT}; a file already there "
        "is never replaced)"
    )
    p.add_argument("--quick", action="store_true", help="a smaller grid (about a minute)")
    p.add_argument(
        "--budget-s",
        type=float,
        default=sum(SECTION_SECONDS.values()),
        help="time budget in seconds",
    )
    p.add_argument("--skip-checks", action="store_true", help="skip the correctness checks")
    p.add_argument(
        "--refit",
        type=Path,
        metavar="PROFILE",
        help="refit PROFILE from its _raw.csv (no GPU needed)",
    )
    p.add_argument(
        "--cpu-smoke-test", action="store_true", help=argparse.SUPPRESS
    )  # tests: tiny run on CPU
    return p.parse_args(argv)


def refit(profile_path: Path) -> int:
    from kvsim.gpu_validation.fitting import build_profile
    from kvsim.simulator.cost_model.calibration_profile import (
        ProfileError,
        read_profile,
        write_profile,
    )

    try:
        old = read_profile(profile_path)
    except ProfileError as e:  # one line, as every kvsim error (this runs as its own program)
        print(f"error: {e}", file=sys.stderr)
        return 2
    raw = profile_path.with_name(profile_path.stem + "_raw.csv")
    if not raw.is_file():
        print(f"error: kvsim calibrate --refit: {raw} not found", file=sys.stderr)
        return 2
    new = build_profile(read_rows(raw), old.metadata, old.decode_shape)
    write_profile(new, profile_path)
    print(f"refitted {profile_path} from {raw}")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = _parse_args(argv)
    if args.refit:
        return refit(args.refit)
    if args.cpu_smoke_test:
        os.environ["TRITON_INTERPRET"] = "1"  # before the kernels are defined
    try:
        import torch
        import triton  # noqa: F401
    except ImportError as e:
        print(
            f"kvsim calibrate: needs torch and triton ({e}); install kvsim[gpu] on a GPU machine",
            file=sys.stderr,
        )
        return 2
    if not args.cpu_smoke_test and not torch.cuda.is_available():
        print(NO_GPU_MESSAGE, file=sys.stderr)
        return 2
    return _run(args)


def outputs(out: Path, slug: str) -> tuple[Path, Path, Path]:
    """The files a run for GPU ``slug`` writes into ``out``: raw rows, summary, profile."""
    return out / f"{slug}_raw.csv", out / f"{slug}_summary.json", out / f"{slug}.yaml"


def _run(args: argparse.Namespace) -> int:
    import torch
    import triton

    from kvsim.gpu_validation import measurements as M
    from kvsim.gpu_validation.correctness import CheckSizes, check_decode, run_checks
    from kvsim.gpu_validation.fitting import build_profile
    from kvsim.gpu_validation.report import format_summary, hbm_peak_from_name, summarize
    from kvsim.gpu_validation.timing import Timer
    from kvsim.simulator.cost_model.calibration_profile import ProfileMetadata, write_profile

    t_start = time.monotonic()
    end = t_start + args.budget_s
    scale = args.budget_s / sum(SECTION_SECONDS.values())

    def deadline(section: str) -> float:
        return min(time.monotonic() + SECTION_SECONDS[section] * scale, end)

    smoke = args.cpu_smoke_test
    device = torch.device("cpu") if smoke else torch.device("cuda")
    grid = (
        M.BenchGrid.cpu_smoke() if smoke else (M.BenchGrid.quick() if args.quick else M.BenchGrid())
    )
    if smoke:
        name, sms, peak = "cpu-smoke-test", 1, 1e11
    else:
        props = torch.cuda.get_device_properties(device)
        name, sms = torch.cuda.get_device_name(device), props.multi_processor_count
        peak = hbm_peak_from_name(name)
    slug = gpu_slug(name)
    taken = [p for p in outputs(args.out, slug) if p.exists() or p.is_symlink()]
    if taken:  # hours of GPU time are not spent on a result that cannot be written
        print(f"error: {taken[0]}: exists; kvsim calibrate never replaces a file: remove it or give "
              "another --out", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    csv_path = args.out / f"{slug}_raw.csv"
    print(
        f"kvsim calibrate: {name} ({sms} SMs), torch {torch.__version__}, triton {triton.__version__}"
    )

    rows: list[dict] = []
    truncated: list[str] = []
    failed: list[str] = []
    ok = True

    def record_checks(results) -> bool:
        for r in results:
            print(f"  [{'ok' if r.ok else 'FAIL'}] {r.name}: {r.detail}")
            rows.append(dict(section="check", kernel=r.name, ok=int(r.ok), detail=r.detail))
        return all(r.ok for r in results)

    def section(name: str, fn, *a):
        """Run one section; a crash is reported and the rest of the benchmark goes on."""
        try:
            new, cut = fn(*a)
        except Exception:  # the raw CSV of the other sections is still worth having
            traceback.print_exc()
            failed.append(name)
            return
        rows.extend(new)
        truncated.extend([name] if cut else [])
        write_rows(rows, csv_path)
        if device.type == "cuda":
            torch.cuda.empty_cache()
        note = " (cut by the time budget)" if cut else ""
        print(f"{name}: {len(new)} points{note} ({time.monotonic() - t_start:.0f} s)")

    sizes = CheckSizes.tiny() if smoke else CheckSizes()
    if not args.skip_checks:
        ok = record_checks(run_checks(device, sizes))
        print(
            f"correctness: {'all passed' if ok else 'FAILED'} ({time.monotonic() - t_start:.0f} s)"
        )

    timer = Timer(device, warmup=1 if smoke else 2, reps=1 if smoke else 7)
    configs: dict = {}

    def decode_sections():
        nonlocal ok
        bench = M.DecodeBench(grid, device)
        tuned, tune_rows = M.tune_decode(bench, timer, deadline("tune"))
        configs.update(tuned)
        print(f"decode launch configs: {tuned}")
        if not args.skip_checks:  # the tuned configs must be as right as the default one
            one_size = replace(sizes, block_sizes=(16,))
            for cfg in dict.fromkeys(tuned.values()):
                print(f"correctness of {cfg}:")
                ok &= record_checks(check_decode(device, one_size, (torch.float16,), cfg))
        decode_rows, cut = M.measure_decode(bench, timer, tuned, deadline("decode"))
        split_rows = M.measure_split_effect(bench, timer, tuned["paged"])
        return tune_rows + decode_rows + split_rows, cut

    section("decode", decode_sections)
    if not smoke:
        section("memcpy", lambda: (M.measure_memcpy(device, timer), False))
    section("gemm", M.measure_gemm, grid, device, timer, deadline("gemm"))
    section("prefill", M.measure_prefill, grid, device, timer, deadline("prefill"))
    section("pool", M.measure_pool, grid, device, timer, deadline("pool"))

    notes = (
        f"decode grid: kv_heads={grid.num_kv_heads}, head_dim={grid.head_dim}, group={grid.group}, "
        f"random block tables; configs {configs}; pool {grid.pool_layers} layers. "
        f"correctness {'passed' if ok else 'FAILED'}"
        + (f"; cut by the time budget: {', '.join(truncated)}" if truncated else "")
        + (f"; failed: {', '.join(failed)}" if failed else "")
        + ". Per-block swap latency includes PyTorch's per-copy dispatch."
    )
    metadata = ProfileMetadata(
        gpu=name,
        date=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        synthetic=False,
        hbm_peak_bytes_per_s=peak or 1.0,
        gpu_slug=slug,
        driver="" if smoke else _driver_version(),
        cuda=str(torch.version.cuda or ""),
        torch=torch.__version__,
        triton=triton.__version__,
        num_sms=sms,
        dtype=str(grid.dtype).split(".")[-1],
        notes=notes + ("" if peak else " HBM peak unknown: hbm_peak_bytes_per_s is a placeholder."),
    )
    shape = {"num_kv_heads": grid.num_kv_heads, "head_dim": grid.head_dim, "group": grid.group}
    summary = summarize(rows, peak)
    summary.update(
        correctness_passed=ok,
        truncated_sections=truncated,
        failed_sections=failed,
        seconds=time.monotonic() - t_start,
    )
    (args.out / f"{slug}_summary.json").write_text(json.dumps(summary, indent=2, default=str))
    print(format_summary(summary))
    try:
        profile = build_profile([r for r in rows if r["section"] != "check"], metadata, shape)
    except ValueError as e:
        print(f"no profile written: {e}; raw data in {csv_path}", file=sys.stderr)
        return 1
    profile_path = write_profile(profile, args.out / f"{slug}.yaml")
    print(f"wrote {profile_path}, {csv_path} ({time.monotonic() - t_start:.0f} s)")
    return 0 if ok and not failed else 1


if __name__ == "__main__":
    raise SystemExit(main())
