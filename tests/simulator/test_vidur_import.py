"""``kvsim calibrate --import`` on Vidur's profiling CSVs, and the shipped A100 profile it made.

Expected times are read here from the shipped Vidur extract (milliseconds, one layer) with the
csv module and assembled by hand, not through the importer or the model's helpers.
"""

import csv
import warnings

import pytest
import yaml
from run_configs import sharegpt_config

from kvsim.policies.paged_allocator import PagedAllocator
from kvsim.simulator.cli import main as kvsim
from kvsim.simulator.cost_model import GPUS, MODELS, BatchShape
from kvsim.simulator.cost_model.base import Deployment, causal_attention_pairs
from kvsim.simulator.cost_model.operator_profile import PROFILES_DIR, read_operator_profile
from kvsim.simulator.cost_model.profiled import (
    ProfiledCostModel,
    ProfileExtrapolationWarning,
    load_profile,
)
from kvsim.simulator.cost_model.vidur_import import (
    VidurFormatError,
    convert_vidur,
    default_name,
    import_vidur,
    is_vidur_folder,
)
from kvsim.simulator.engine import Simulation
from kvsim.simulator.scheduler import SchedulerSettings
from kvsim.traces import Request

NAME = "a100-llama-3-8b"
EXTRACT = PROFILES_DIR / f"{NAME}.vidur" / "data/profiling/compute/a100/meta-llama/Meta-Llama-3-8B"
LAYERS = 32  # Llama-3-8B decoder layers
LAYER_OPS = ("input_layernorm", "attn_pre_proj", "attn_rope", "attn_post_proj", "post_attention_layernorm",
             "mlp_up_proj", "mlp_act", "mlp_down_proj", "add")


def rows(name):
    with (EXTRACT / name).open(newline="") as f:
        return list(csv.DictReader(f))


MLP = {int(r["num_tokens"]): r for r in rows("mlp.csv")}
ATTN = rows("attention.csv")


def ms(r, op):
    return float(r[f"time_stats.{op}.median"]) * 1e-3


def dense_s(tokens):
    """Every layer's dense operators plus the embedding, at a measured token count (s)."""
    r = MLP[tokens]
    return LAYERS * sum(ms(r, op) for op in LAYER_OPS) + ms(r, "emb")


def attention_s(chunk=0, prefix=0, batch=0, context=0):
    """One layer's attention at a measured shape: the row's attention operators summed (s)."""
    for r in ATTN:
        prefill = r["is_prefill"] == "True"
        if (prefill and (int(r["prefill_chunk_size"]), int(r["kv_cache_size"])) == (chunk, prefix) and not batch) or (
                not prefill and not chunk and (int(r["batch_size"]), int(r["kv_cache_size"])) == (batch, context)):
            return sum(ms(r, op) for op in ("attn_input_reshape", "attn_kv_cache_save", "attn_prefill",
                                            "attn_decode", "attn_output_reshape"))
    raise KeyError((chunk, prefix, batch, context))


@pytest.fixture(scope="module")
def profile():
    return load_profile(NAME)


def model(profile):
    return ProfiledCostModel(profile, Deployment(MODELS["llama-3-8b"], GPUS["a100-80gb"]))


# --- the converter ------------------------------------------------------------------------------
def test_converts_the_shipped_extract():
    prof, licence, sources = convert_vidur(EXTRACT)
    assert prof.name == NAME and licence.name == "LICENSE" and sources.name == "SOURCES.md"
    t = prof.tp[1]
    assert t.dense["attn_pre_proj"].x[:4] == (1, 2, 4, 8) and t.dense["attn_pre_proj"].x[-1] == 32768
    assert t.dense["mlp_up_proj"].seconds[t.dense["mlp_up_proj"].x.index(512)] == pytest.approx(0.516e-3)
    assert t.per_sequence == {}  # Vidur times no LM head or sampler
    a = t.attention
    assert (a.prefill_chunk, a.kv_prefill) == ((0, 64, 512, 1024), (0, 1024, 2048, 3072, 4096, 8192))
    assert (a.n_decode, a.kv_decode) == ((0, 1, 2, 4, 8, 16, 32, 48, 64), (0, 512, 1024, 2048))
    ix = (a.prefill_chunk.index, a.kv_prefill.index, a.n_decode.index, a.kv_decode.index)
    assert a.at(ix[0](512), ix[1](2048), 0, 0) == pytest.approx((0.253 + 0.201) * 1e-3)
    assert a.at(0, 0, ix[2](8), ix[3](1024)) == pytest.approx((0.003 + 0.039) * 1e-3)
    assert a.at(ix[0](64), ix[1](8192), 0, 0) is None  # not in the extract: a hole, not invented
    assert a.at(ix[0](512), 0, ix[2](8), ix[3](512)) is None  # Vidur times no mixed step
    assert a.at(0, 0, ix[2](64), ix[3](1024)) is None
    assert len(a.points()) == len(ATTN) == 39
    assert prof.model == {"name": "meta-llama/Meta-Llama-3-8B", "variant": "fp16", "architecture": "llama",
                          "num_heads": 32, "num_kv_heads": 8, "ffn_size": 14336, "vocab_size": 128256}
    assert prof.per_layer == dict.fromkeys(LAYER_OPS, 1) and prof.per_step == ("emb",)
    prov = prof.provenance
    assert "microsoft/vidur" in prov["source"] and "41ab8ab15cd6217284b025750fc6b81364d359e6" in prov["source"]
    assert prov["engine"] == "Vidur (sarathi-serve / vLLM kernels)" and prov["gpu"].startswith("NVIDIA A100")
    assert prov["licence"].startswith("MIT License") and "Microsoft" in prov["licence"]
    assert "KV block size 16" in prov["measurement"]


def test_the_shipped_profile_is_the_import_of_the_shipped_extract(tmp_path):
    path = import_vidur(EXTRACT, tmp_path)
    assert path.name == f"{NAME}.yaml"
    assert read_operator_profile(path).to_dict() == read_operator_profile(PROFILES_DIR / f"{NAME}.yaml").to_dict()
    assert (tmp_path / f"{NAME}.LICENSE").read_text() == (PROFILES_DIR / f"{NAME}.LICENSE").read_text()
    assert "MIT License" in (tmp_path / f"{NAME}.LICENSE").read_text()
    assert (tmp_path / f"{NAME}.SOURCES.md").read_text() == (PROFILES_DIR / f"{NAME}.SOURCES.md").read_text()


def test_the_cli_detects_the_format(tmp_path, capsys):
    assert is_vidur_folder(EXTRACT) and not is_vidur_folder(EXTRACT.parent)
    assert kvsim(["calibrate", "--import", str(EXTRACT), "--out", str(tmp_path), "--name", "mine"]) == 0
    assert (tmp_path / "mine.yaml").is_file() and (tmp_path / "mine.LICENSE").is_file()
    assert "profile:" in capsys.readouterr().out
    # the other format, forced on this folder: a one-line error naming what is missing
    assert kvsim(["calibrate", "--import", str(EXTRACT), "--out", str(tmp_path), "--format", "bundle"]) == 2
    err = capsys.readouterr().err.strip()
    assert "meta.yaml" in err and len(err.splitlines()) == 1


def copy(tmp_path, mlp=None, attention=None, where="compute/a100/org/Tiny-1B"):
    folder = tmp_path / where
    folder.mkdir(parents=True)
    (folder / "mlp.csv").write_text(mlp if mlp is not None else (EXTRACT / "mlp.csv").read_text())
    (folder / "attention.csv").write_text(attention if attention is not None else
                                          (EXTRACT / "attention.csv").read_text())
    return folder


def test_names_come_from_the_path_or_the_options(tmp_path):
    prof, licence, sources = convert_vidur(copy(tmp_path))
    assert prof.name == "a100-tiny-1b" and prof.model["name"] == "org/Tiny-1B"
    assert licence is None and prof.provenance["licence"] == "unknown"
    with pytest.raises(VidurFormatError, match="give --gpu and --model"):
        convert_vidur(copy(tmp_path, where="flat"))
    prof, _, _ = convert_vidur(tmp_path / "flat", gpu="h100", model="org/Other-2B")
    assert prof.name == "h100-other-2b"
    assert default_name("a100", "meta-llama/Meta-Llama-3-8B") == NAME


def test_repeated_rows_are_averaged(tmp_path):
    lines = (EXTRACT / "mlp.csv").read_text().splitlines()
    last = lines[-1].split(",")  # num_tokens 1
    twice = ",".join(["0.005", *last[1:]])  # the same shape again, emb 5 us instead of 3 us
    prof, _, _ = convert_vidur(copy(tmp_path, mlp="\n".join([*lines, twice]) + "\n"))
    emb = prof.tp[1].dense["emb"]
    assert emb.x[0] == 1 and emb.seconds[0] == pytest.approx(4e-6)


@pytest.mark.parametrize("which, edit, message", [
    ("mlp", lambda t: t.replace("time_stats.add.median", "time_stats.other.median"),
     r"mlp.csv: missing column\(s\) time_stats.add.median"),
    ("mlp", lambda t: t.replace(",True,32768,1", ",True,lots,1"), r"mlp.csv:2: num_tokens: expected an integer"),
    ("mlp", lambda t: t.replace("32,8,4096,14336,128256,True,8192,1", "32,4,4096,14336,128256,True,8192,1"),
     r"mlp.csv:3: model shape .* differs"),
    ("attention", lambda t: t.replace(",1,64,0,True,", ",2,64,0,True,"),
     r"attention.csv:2: a prefill row needs batch_size 1"),
    ("attention", lambda t: t.replace(",0,512,False,", ",16,512,False,", 1),
     r"attention.csv:\d+: a decode row needs prefill_chunk_size 0"),
    ("attention", lambda t: t.replace("True,AttentionBackend", "yes,AttentionBackend", 1),
     r"attention.csv:2: is_prefill: expected True or False"),
    ("attention", lambda t: "\n".join(x for x in t.splitlines() if "False" not in x) + "\n",
     r"attention.csv: tensor-parallel degree 1 needs prefill and decode rows"),
    ("attention", lambda t: t.replace("0.0,0.019,0.011", "0.0,0.019,-1", 1),
     r"attention.csv:2: time_stats.attn_prefill.median: expected a value >= 0"),
])
def test_bad_input_is_one_line_naming_file_line_and_column(tmp_path, which, edit, message):
    text = {"mlp": (EXTRACT / "mlp.csv").read_text(), "attention": (EXTRACT / "attention.csv").read_text()}
    text[which] = edit(text[which])
    folder = copy(tmp_path, text["mlp"], text["attention"])
    with pytest.raises(VidurFormatError, match=message) as e:
        convert_vidur(folder)
    assert "\n" not in str(e.value)


# --- the profiled model on it ------------------------------------------------------------------
@pytest.mark.parametrize("n, kd", [(1, 512), (8, 1024), (64, 2048)])
def test_decode_step_at_a_grid_point_is_the_table_sum(profile, n, kd):
    got = model(profile).step_time(BatchShape(decode_seqs=n, decode_context=n * kd))
    assert got == pytest.approx(dense_s(n) + LAYERS * attention_s(batch=n, context=kd), rel=1e-9)


def test_decode_step_between_grid_points_is_interpolated(profile):
    """12 sequences at 1,536 tokens: tokens between 8 and 16, decodes between 8 and 16,
    context between 1,024 and 2,048, each linear."""
    def at(n, kd):
        return attention_s(batch=n, context=kd)

    w = 0.5  # 12 between 8 and 16; 1536 between 1024 and 2048
    attn = (1 - w) * ((1 - w) * at(8, 1024) + w * at(8, 2048)) + w * ((1 - w) * at(16, 1024) + w * at(16, 2048))
    dense = (1 - w) * dense_s(8) + w * dense_s(16)
    got = model(profile).step_time(BatchShape(decode_seqs=12, decode_context=12 * 1536))
    assert got == pytest.approx(dense + LAYERS * attn, rel=1e-9)


def test_prefill_and_mixed_steps(profile):
    m = model(profile)
    prefill = BatchShape(prefill_seqs=1, prefill_tokens=512, prefill_attn_pairs=causal_attention_pairs(512, 2048))
    assert m.step_time(prefill) == pytest.approx(dense_s(512) + LAYERS * attention_s(512, 2048), rel=1e-9)
    # no mixed point measured: the chunk's attention plus the decodes', as Vidur adds them
    mixed = BatchShape(prefill_seqs=1, prefill_tokens=512, prefill_attn_pairs=causal_attention_pairs(512, 2048),
                       decode_seqs=16, decode_context=16 * 1024)
    tokens = 512 + 16  # between the measured 512 and 768
    dense = dense_s(512) + (tokens - 512) / (768 - 512) * (dense_s(768) - dense_s(512))
    want = dense + LAYERS * (attention_s(512, 2048) + attention_s(batch=16, context=1024))
    assert m.step_time(mixed) == pytest.approx(want, rel=1e-9)
    assert not m.out_of_grid


def test_a_run_on_the_profile_takes_its_step_times_from_it(profile):
    """One 64-token prompt then 19 decode steps with macro-stepping on: the prefill step is the
    64-token chunk's row, each decode step the 1-sequence row at the smallest measured context
    (512; below it the time is flat), and the decode steps run as one macro step."""
    sim = Simulation([Request(0, 0.0, 64, 20)], lambda: PagedAllocator(1000, 16), lambda: model(profile),
                     SchedulerSettings(max_seq_len=4096, max_num_batched_tokens=4096), macro_steps=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ProfileExtrapolationWarning)
        sim.run()
    steps = sim.steps.frame()
    assert steps["iterations"].tolist() == [1, 19]
    assert steps["duration_s"].iloc[0] == pytest.approx(dense_s(64) + LAYERS * attention_s(64, 0), rel=1e-9)
    decode = dense_s(1) + LAYERS * attention_s(batch=1, context=512)
    assert steps["duration_s"].iloc[1] == pytest.approx(19 * decode, rel=1e-9)


def test_run_experiment_with_the_a100_profile(tmp_path):
    from kvsim.simulator.config import validate_config
    from kvsim.simulator.runner import run_experiment

    cfg = validate_config(sharegpt_config(
        tmp_path, name="vidur-a100", model="llama-3-8b", gpu="a100-80gb", rate=4.0, num_requests=40,
        scheduler={"max_num_batched_tokens": 4096}, cost_model={"kind": "profiled", "profile": NAME}))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ProfileExtrapolationWarning)
        result = run_experiment(cfg)
    s = result.summary
    assert s["completed"] == 40
    # a decode step costs at least the 1-sequence one read off the extract, at most a 64-sequence one
    assert 1e3 * (dense_s(1) + LAYERS * attention_s(batch=1, context=512)) <= s["mean_tpot_ms"]
    assert s["mean_tpot_ms"] <= 1e3 * (dense_s(64) + LAYERS * attention_s(batch=64, context=2048)) * 1.5


def test_the_shipped_yaml_is_small_and_attributed():
    path = PROFILES_DIR / f"{NAME}.yaml"
    assert path.stat().st_size < 20_000
    head = yaml.safe_load(path.read_text())
    assert head["provenance"]["attribution"] == f"{NAME}.SOURCES.md"
    assert (PROFILES_DIR / f"{NAME}.vidur" / "LICENSE").read_text().startswith("MIT License")


def _without(profile, axis, value):
    """The profile with one value of one attention axis (or a token count of the dense tables) left out."""
    import dataclasses

    from kvsim.simulator.cost_model.operator_profile import AttentionGrid, Table1D, TPTables

    t = profile.tp[1]
    if axis == "tokens":
        dense = {op: Table1D(tuple(x for x in tb.x if x != value),
                             tuple(s for x, s in zip(tb.x, tb.seconds) if x != value)) for op, tb in t.dense.items()}
        return dataclasses.replace(profile, tp={1: TPTables(dense, t.per_sequence, t.attention)})
    names = ("prefill_chunk", "kv_prefill", "n_decode", "kv_decode")
    axes = {ax: getattr(t.attention, ax) for ax in names}
    axes[axis] = tuple(v for v in axes[axis] if v != value)
    pts = {p[:4]: p[4] for p in t.attention.points()}
    grid = AttentionGrid(*axes.values(), tuple(pts.get((i, j, k, m)) for i in axes[names[0]] for j in axes[names[1]]
                                               for k in axes[names[2]] for m in axes[names[3]]))
    return dataclasses.replace(profile, tp={1: TPTables(t.dense, t.per_sequence, grid)})


def test_held_out_step_times(profile):
    """Each interior measured value of each axis left out in turn, the model rebuilt without it
    and asked for the step times there (gaps of 4-16x on this coarse extract): step times
    within 5% median and 15% p95 on every axis (measured: dense 2.0% / 4.3%, chunk 2.5% / 9.6%,
    prefix 0.5% / 2.2%, decodes 1.2% / 8.1%, context 0.3% / 1.3%)."""
    full = model(profile)
    a = profile.tp[1].attention
    errors = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ProfileExtrapolationWarning)
        for x in profile.tp[1].dense["emb"].x[1:-1]:
            m = model(_without(profile, "tokens", x))
            shape = (BatchShape(decode_seqs=x, decode_context=x * 1024) if x <= 64 else
                     BatchShape(prefill_seqs=1, prefill_tokens=x, prefill_attn_pairs=causal_attention_pairs(x, 0)))
            errors.setdefault("tokens", []).append(abs(m.step_time(shape) / full.step_time(shape) - 1))
        for col, axis in enumerate(("prefill_chunk", "kv_prefill", "n_decode", "kv_decode")):
            nonzero = [v for v in getattr(a, axis) if v]
            for v in nonzero[1:-1]:  # interior values only: the ends are extrapolation, not interpolation
                m = model(_without(profile, axis, v))
                for pc, kp, nd, kd, _ in a.points():
                    if (pc, kp, nd, kd)[col] == v:
                        shape = BatchShape(prefill_seqs=int(pc > 0), prefill_tokens=pc,
                                           prefill_attn_pairs=causal_attention_pairs(pc, kp) if pc else 0.0,
                                           decode_seqs=nd, decode_context=nd * kd)
                        errors.setdefault(axis, []).append(abs(m.step_time(shape) / full.step_time(shape) - 1))
    assert sorted(errors) == ["kv_decode", "kv_prefill", "n_decode", "prefill_chunk", "tokens"]
    for axis, e in errors.items():
        e.sort()
        assert e[len(e) // 2] < 0.05 and e[min(len(e) - 1, round(0.95 * (len(e) - 1)))] < 0.15, axis
