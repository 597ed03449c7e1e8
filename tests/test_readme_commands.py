"""Every command README.md shows runs as written.

The commands are read from the README itself: each line of a ```bash / ```sh block (a
trailing ``# comment`` dropped, ``\\`` continuations joined), each ``$ `` line of a
```console block, and every inline `` `kvsim ...` ``, `` `python -m ...` ``, `` `make ...` ``,
`` `pip ...` ``, `` `bash ...` `` span. A fenced block must say what it holds (``bash``,
``console``, ``text``, ``yaml``, ...), so a command cannot hide in an untagged one.

Each command is either in :data:`RUN` or in :data:`NOT_RUN` (with why); a command in neither,
or an entry the README no longer shows, fails :func:`test_every_readme_command_is_run_or_listed`.
A command of :data:`RUN` runs in a folder holding a copy of the checkout's ``configs/``,
``traces/`` and ``gpu_validation/`` (so it runs from where a fresh clone would, and writes
into the copy), as written plus the arguments its :class:`Shrink` appends: a sweep gets
``--workers 1`` (its runs in this process, not a pool of fresh interpreters) and every run
a few requests (``--set workload.window.num_requests=20`` and the like). It must exit 0;
``kvsim`` commands are called through the console script's ``main``, ``python -m`` ones with
``runpy``, in this process. ``make run`` and ``make test`` install, so they are not run; no
command that needs CUDA, a Ray cluster or an install is. Every command, run or not, is checked
for the repository paths it names and the ``make`` targets it calls, and the ``kvsim`` and
``python -m`` commands not run for the options they show (against their ``--help``).
"""

from __future__ import annotations

import contextlib
import io
import re
import runpy
import shlex
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
SHELL_TAGS = {"bash", "sh", "shell", "console"}
PROGRAMS = ("kvsim", "python", "python3", "make", "pip", "bash", "ray", "jupyter")


# --- reading the commands ------------------------------------------------------------------

def fenced_blocks(text: str) -> list[tuple[str, str]]:
    """(tag, body) of every fenced block, in order."""
    return re.findall(r"^```([^\n`]*)\n(.*?)^```[ \t]*$", text, re.S | re.M)


def block_commands(tag: str, body: str) -> list[str]:
    if tag == "console":
        return [line[2:].strip() for line in body.splitlines() if line.startswith("$ ")]
    out, pending = [], ""
    for line in body.splitlines():
        line = re.sub(r"(^|\s)#.*$", "", line).rstrip()  # a comment, to the end of the line
        if line.endswith("\\"):
            pending += line[:-1].strip() + " "
            continue
        line = (pending + line.strip()).strip()
        pending = ""
        if line:
            out.append(line)
    return out


def readme_commands(text: str) -> list[str]:
    """Every command the README shows, once each, in order of first appearance."""
    found: list[str] = []
    for tag, body in fenced_blocks(text):
        if tag.strip() in SHELL_TAGS:
            found += block_commands(tag.strip(), body)
    prose = re.sub(r"^```.*?^```[ \t]*$", "", text, flags=re.S | re.M)
    for span in re.findall(r"`([^`]+)`", prose):
        span = " ".join(span.split())
        if re.match(rf"({'|'.join(PROGRAMS)}) \S", span):
            found.append(span)
    return list(dict.fromkeys(found))


# --- what runs, and how small ----------------------------------------------------------------

@dataclass(frozen=True)
class Shrink:
    """``args``: appended to the README's command (a tiny workload, one worker); ``after``:
    README commands whose results this one reads, run first in the same folder; ``tiny``:
    ``kvsim reproduce`` at 40 requests a run (``reproduce.run_experiments(tiny=True)``, which
    the command line does not offer)."""

    args: tuple[str, ...] = ()
    after: tuple[str, ...] = ()
    tiny: bool = False


ONE_WORKER = ("--workers", "1")
TRACE_20 = ("--set", "workload.window.num_requests=20")  # the first 20 requests of a trace window
GEN_20 = ("--set", "workload.num_requests=20")  # a generated workload of 20 requests
BLOCK_SIZES = "kvsim sweep configs/sweeps/block_size.yaml --plot"
TIERS_MT = "kvsim sweep configs/tiers/sweep_multi_turn.yaml --plot"
TIERS_MOON = "kvsim sweep configs/tiers/sweep_mooncake.yaml --plot"
# The tier sweeps at two sizes and one eviction order (the three write policies stay: the
# tables and plots read all three).
TIER_GRID = ("--grid", "allocator.tiers.0.capacity_gib=0,32")

RUN: dict[str, Shrink] = {
    "kvsim run quickstart": Shrink(TRACE_20),
    "kvsim run quickstart --quiet": Shrink(TRACE_20),
    "kvsim run sglang_vs_vllm/mooncake --no-plot": Shrink(TRACE_20),
    "kvsim run sglang_vs_vllm/mooncake --no-plot --set workload.window.num_requests=3993 --set scheduler.policy=sglang "
    "--set scheduler.max_num_batched_tokens=null --set allocator.block_size=1": Shrink(TRACE_20),  # (the last wins)
    "kvsim run configs/quickstart.yaml": Shrink(TRACE_20),
    "kvsim run configs/quickstart.yaml --set allocator.block_size=32 --set workload.window.duration_s=120":
        Shrink(TRACE_20),
    "kvsim run configs/quickstart.yaml --set cost_model.kind=profiled --set cost_model.profile=rtx4090-llama-3.1-8b "
    "--set model.name=llama-3.1-8b --set hardware.gpu=rtx4090 --set hardware.num_gpu_blocks=2588": Shrink(TRACE_20),
    "kvsim sweep configs/sweeps/block_size.yaml": Shrink(TRACE_20 + ONE_WORKER),
    BLOCK_SIZES: Shrink(TRACE_20 + ONE_WORKER),
    "kvsim plot results/block-size": Shrink(after=(BLOCK_SIZES,)),
    "kvsim sweep configs/quickstart.yaml --grid allocator.block_size=1,2,4,8,16,32,64,128,256":
        Shrink(TRACE_20 + ONE_WORKER),
    "kvsim sweep configs/vllm_paper/fig12_opt13b_sharegpt.yaml": Shrink(GEN_20 + ONE_WORKER),
    "kvsim sweep configs/sglang_vs_vllm/sweep_fewshot.yaml": Shrink(GEN_20 + ONE_WORKER),
    "kvsim sweep configs/sweeps/sustainable_rate.yaml": Shrink(GEN_20 + ONE_WORKER),
    "kvsim sweep configs/quickstart.yaml --zip label=vLLM,Orca-Max --zip allocator.kind=paged,contiguous "
    "--zip allocator.preset=null,orca-max --set workload.window.duration_s=120": Shrink(TRACE_20 + ONE_WORKER),
    "kvsim sweep configs/quickstart.yaml --find-rate lo=0.25,hi=4,tolerance=0.05,max_normalized_latency=0.1 "
    "--set workload.window.duration_s=120": Shrink(TRACE_20 + ONE_WORKER),
    "kvsim sweep configs/sweeps/swap_recompute.yaml --dry-run": Shrink(),
    "kvsim sweep configs/sweeps/allocators.yaml --retry-failed": Shrink(GEN_20 + ONE_WORKER),
    TIERS_MT: Shrink(("--set", "workload.multi_turn.conversations=3", *TIER_GRID,
                      "--grid", "allocator.tiers.0.eviction_policy=lru", *ONE_WORKER)),
    TIERS_MOON: Shrink((*TRACE_20, *TIER_GRID, "--grid", "allocator.tiers.0.eviction_policy=arc", *ONE_WORKER)),
    "python -m kvsim.simulator.app.tier_tables": Shrink(after=(TIERS_MT, TIERS_MOON)),
    "kvsim trace stats traces/data/AzureLLMInferenceTrace_conv.csv": Shrink(),
    "kvsim trace plot traces/data/synthetic_trace.jsonl -o mooncake.png": Shrink(),
    # Every section at tiny size runs in tests/simulator/app/test_reproduce.py (minutes here);
    # these check that each section's sweeps, as --quick or the full run builds them, are valid.
    "kvsim reproduce vllm-paper --quick": Shrink(("--dry-run",)),
    "kvsim reproduce vllm-paper": Shrink(("--dry-run",)),
    "kvsim reproduce vllm-paper --only fig2,fig13": Shrink((*ONE_WORKER, "--no-progress"), tiny=True),
    "kvsim reproduce vllm-paper --only fig2": Shrink((*ONE_WORKER, "--no-progress"), tiny=True),
    "kvsim reproduce vllm-paper --quick --dry-run": Shrink(),
    "kvsim calibrate --import gpu_validation/profiles/a100-llama-3-8b.vidur/data/profiling/compute/a100/meta-llama/"
    "Meta-Llama-3-8B": Shrink(),
    "kvsim validate gpu_validation/runs/vllm-0.19-rtx4090-llama-3.1-8b": Shrink(("--no-plot",)),
    "python -m kvsim.simulator.cost_model.roofline_check --plot roofline.png": Shrink(),
    "python -m kvsim.simulator.cost_model.roofline_check a100-llama-3-8b --gpu a100-80gb --model llama-3-8b "
    "[--efficiencies NAME]": Shrink(),  # (run without its optional part)
    "python -m kvsim.simulator.cost_model.roofline_check [--efficiencies NAME] [--plot PNG]": Shrink(),
    "python -m kvsim.simulator.app.prefix_cache_experiment": Shrink(("--tiny",)),
    "python -m kvsim.simulator.cost_model.hybrid_table": Shrink(),
}

INSTALLS = "installs packages (make test installs the dev extras and runs the suite this test is in)"
MAKE = "a make target: installs into .venv first; only checked to exist in the Makefile"
NOT_RUN: dict[str, str] = {
    "make run": MAKE, "make test": MAKE, "make bench": MAKE, "make lint": MAKE, "make clean": MAKE,
    "make mutate": MAKE, "make mutate MUTANTS='kvsim.policies.ledger.block_pool*'": MAKE, "make test-long": MAKE,
    "make test-long SEED=N": MAKE, "make wheel-check": MAKE,
    "pip install .": INSTALLS, "pip install -e '.[ray]'": INSTALLS, "pip install -e '.[gpu]'": INSTALLS,
    "pip install -e '.[notebooks]' && jupyter lab notebooks/": INSTALLS + "; jupyter opens a browser",
    "python -m pip wheel --no-deps .": "builds the wheel: tests/packaging/ does, and installs it",
    "pip --target": "an option named in prose (tests/packaging/ installs the wheel with it)",
    "cat bad.yaml": "the error example: tests/simulator/app/test_safety_outputs.py writes the file shown",
    "kvsim run bad.yaml": "the error example, which must fail: test_readme_error_example_is_the_real_message "
                          "runs it and compares the message",
    "ray start --head": "starts a Ray cluster's head node "
                        "(tests/simulator/app/sweep/test_ray.py runs the Ray executor)",
    "kvsim sweep FILE --executor ray --address auto": "a form (FILE), on a Ray cluster",
    "kvsim sweep FILE --executor ray --workers 2": "a form (FILE); a local Ray takes tens of seconds to start "
                                                   "(tests/simulator/app/sweep/test_ray.py)",
    "kvsim calibrate": "needs CUDA (the GPU benchmark)",
    "kvsim sweep configs/vllm_paper/fig13_batched_requests.yaml --set cost_model.host=none":
        "Fig. 13's sweep without host time at full size (10 runs of 1,000-4,000 requests); "
        "tests/simulator/app/test_paper_host_time.py checks every paper sweep pays it",
    "python -m kvsim.gpu_validation.bench": "needs CUDA (what kvsim calibrate runs)",
    "bash gpu_validation/run_h200.sh": "needs CUDA (the prepared GPU run)",
    "kvsim calibrate --import DIR": "a form: DIR is a profile folder that is not shipped (its import is, as "
                                    "rtx4090-llama-3.1-8b); the shipped Vidur folder's import runs",
    "kvsim calibrate --import": "a command named in prose",
    "kvsim run": "a command named in prose",
    "kvsim sweep": "a command named in prose", "kvsim validate": "a command named in prose",
    "kvsim run --strict": "an option named in prose",
    "kvsim sweep FILE": "a form (FILE)", "kvsim plot SWEEP_DIR": "a form; kvsim plot results/block-size runs",
    "kvsim trace plot FILE": "a form; kvsim trace plot traces/data/synthetic_trace.jsonl runs",
    "python -m kvsim.simulator.cost_model.roofline_fit": "~40 s (a least-squares fit over every profiled step); "
                                                         "tests/simulator/cost_model/test_roofline_fit.py "
                                                         "runs its fits",
    "python -m benchmarks.run --cases moon16,moon256,mt10k,mt30k,mt100k": "a timing benchmark of tens of seconds "
                                                                          "(make bench)",
    "python -m benchmarks.startup --repeat 10": "a timing benchmark (ten fresh processes); "
                                                "tests/benchmarks/test_bench_sglang_startup.py runs its probe once",
    "python -m benchmarks.compare REV [--new-tree DIR] [--old-set|--new-set CASE:key=value]":
        "a form (REV); runs the benchmarks twice, at a git worktree and here",
}
"""Commands not run here, and why. The ``kvsim`` and ``python -m`` ones among them are still
checked: their ``--help`` must list every option they show."""


@pytest.fixture(scope="module")
def commands() -> list[str]:
    return readme_commands(README.read_text())


def test_every_fenced_block_says_what_it_holds():
    untagged = [body.splitlines()[0] for tag, body in fenced_blocks(README.read_text()) if not tag.strip()]
    assert not untagged, f"tag these README blocks (bash for commands, console for a session, text): {untagged}"


def test_the_reader_finds_the_commands_of_this_readme():
    text = "```bash\nkvsim run a.yaml   # comment\nkvsim sweep b.yaml \\\n    --plot\n```\n" \
           "```console\n$ kvsim run c.yaml\nerror: no\n```\n```text\nkvsim/  links\n```\n" \
           "Run `kvsim trace stats\nt.csv` or `make bench`, not `kvsim`."
    assert readme_commands(text) == ["kvsim run a.yaml", "kvsim sweep b.yaml --plot", "kvsim run c.yaml",
                                     "kvsim trace stats t.csv", "make bench"]


def test_every_readme_command_is_run_or_listed(commands):
    both = set(RUN) & set(NOT_RUN)
    assert not both, f"both run and not run: {both}"
    unlisted = [c for c in commands if c not in RUN and c not in NOT_RUN]
    assert not unlisted, ("README commands this test neither runs nor lists (add each to RUN, with the "
                          f"arguments that make it tiny, or to NOT_RUN with why): {unlisted}")
    stale = [c for c in (*RUN, *NOT_RUN) if c not in commands]
    assert not stale, f"entries for commands the README no longer shows: {stale}"
    for shrink in RUN.values():
        assert all(a in RUN for a in shrink.after)


def _paths(command: str) -> list[str]:
    """Repository paths a command names (its inputs; not what it writes)."""
    words = shlex.split(re.sub(r"\[[^]]*\]", "", command.split("&&")[0]))
    out = []
    for before, word in zip(["", *words], words):
        if before in ("-o", "--plot", "--out") or word.startswith(("-", "results/", "'")) or "=" in word:
            continue
        if "/" in word or re.search(r"\.(ya?ml|csv|jsonl|sh|md)$", word):
            out.append(word)
    return out


SHOWN_FILES = {"bad.yaml"}  # the error example: the README shows the file's text (cat bad.yaml)


@pytest.mark.parametrize("command", sorted({*RUN, *NOT_RUN}))
def test_what_a_command_names_exists(command):
    for p in _paths(command):
        if p in SHOWN_FILES:
            continue
        if p.startswith("kvsim.") or command.startswith("kvsim run") and "/" in p and not p.endswith(".yaml"):
            continue  # a module, or a shipped config by name (running it checks the name)
        assert (ROOT / p).exists(), f"{command}: {p} is not in the checkout"
    if command.startswith("make "):
        target = next(w for w in shlex.split(command)[1:] if "=" not in w)
        assert re.search(rf"^{re.escape(target)}:", (ROOT / "Makefile").read_text(), re.M), \
            f"{command}: the Makefile has no target {target}"


def _help_of(command: str) -> str | None:
    """The ``--help`` text of a ``kvsim`` subcommand or a ``python -m`` module (None: neither)."""
    words = shlex.split(command.split("&&")[0])
    if words[0] == "kvsim" and len(words) > 1 and words[1] != "calibrate":
        return _run(["kvsim", *words[1:3 if words[1] == "trace" else 2], "--help"])[1]
    if words[:2] == ["python", "-m"] and words[2].startswith(("kvsim.simulator", "benchmarks.")):
        return _run([*words[:3], "--help"])[1]
    return None


@pytest.mark.parametrize("command", sorted(NOT_RUN))
def test_a_command_not_run_shows_only_options_that_exist(command):
    text = _help_of(command)
    if text is None:
        return
    for option in re.findall(r"(?<![\w-])--[a-z][\w-]*", command):
        assert option in text, f"{command}: its --help has no {option}"


# --- running them ----------------------------------------------------------------------------

def _run(words: list[str]) -> tuple[int, str]:
    """Exit status and output of a ``kvsim`` or ``python -m`` command, run in this process."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        if words[0] == "kvsim":
            from kvsim.simulator.app.cli import main

            rc = main(words[1:])
        else:
            assert words[:2] == ["python", "-m"], words
            argv = sys.argv
            sys.argv = [words[2], *words[3:]]
            try:
                runpy.run_module(words[2], run_name="__main__", alter_sys=True)
                rc = 0
            except SystemExit as e:
                rc = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
            finally:
                sys.argv = argv
    return rc, out.getvalue()


@pytest.fixture(scope="module")
def checkout(tmp_path_factory) -> Path:
    """A folder like a fresh clone's root, for what the commands read; they write into it."""
    here = tmp_path_factory.mktemp("readme")
    for folder in ("configs", "traces", "gpu_validation"):
        shutil.copytree(ROOT / folder, here / folder, ignore=shutil.ignore_patterns("__pycache__", "*.kvsim-cache"))
    return here


_done: dict[Path, set[str]] = {}  # per folder: the commands that ran there


def _run_readme_command(command: str, monkeypatch, folder: Path) -> None:
    shrink = RUN[command]
    for first in shrink.after:
        if first not in _done.setdefault(folder, set()):
            _run_readme_command(first, monkeypatch, folder)
    if shrink.tiny:
        import kvsim.simulator.app.reproduce as rp

        real = rp.run_experiments
        monkeypatch.setattr(rp, "run_experiments", lambda *a, **k: real(*a, **{**k, "tiny": True}))
    words = shlex.split(re.sub(r"\s*\[[^]]*\]", "", command)) + list(shrink.args)
    rc, out = _run(words)
    assert rc == 0, f"{command} (+ {' '.join(shrink.args)}) exited {rc}:\n{out[-3000:]}"
    _done.setdefault(folder, set()).add(command)


@pytest.mark.parametrize("command", list(RUN))
def test_readme_command_runs(command, checkout, monkeypatch):
    monkeypatch.chdir(checkout)
    _run_readme_command(command, monkeypatch, checkout)


def test_make_run_and_make_test_are_targets():
    text = (ROOT / "Makefile").read_text()
    for target in ("run", "test"):
        assert re.search(rf"^{target}:", text, re.M)
    assert " run configs/quickstart.yaml" in text.split("\nrun:")[1].split("\n\n")[0]
