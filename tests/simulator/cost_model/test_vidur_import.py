"""``kvsim calibrate --import`` on Vidur's profiling CSVs, and the shipped A100 profile it made.

Expected times are read here from the shipped Vidur extract (milliseconds, one layer) with the
csv module and assembled by hand, not through the importer or the model's helpers.
"""

import csv
import json
import warnings

import pytest
import yaml
from run_configs import sharegpt_config

from kvsim.policies.ledger.paged_allocator import PagedAllocator
from kvsim.simulator.app.cli import main as kvsim
from kvsim.simulator.cost_model import GPUS, MODELS, BatchShape, profile_cache
from kvsim.simulator.cost_model import operator_profile as op
from kvsim.simulator.cost_model.base import Deployment, causal_attention_pairs
from kvsim.simulator.cost_model.operator_profile import (
    PROFILES_DIR,
    AttentionGrid,
    OperatorProfileError,
    padded_vocab_sizes,
    read_operator_profile,
    write_operator_profile,
)
from kvsim.simulator.cost_model.profiled import (
    ProfiledCostModel,
    ProfileExtrapolationWarning,
    check_profile_model,
    load_profile,
    profiled_cost_factory,
)
from kvsim.simulator.cost_model.vidur_import import (
    VidurFormatError,
    convert_vidur,
    default_name,
    import_vidur,
    is_vidur_folder,
)
from kvsim.simulator.engine.simulation import Simulation
from kvsim.simulator.sched.scheduler import SchedulerSettings
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
    from kvsim.simulator.engine.runner import run_experiment

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


# --- Vidur's full folders: sparse grids, TP-only tables, padded vocabularies -----------------------
ATTN_COLUMNS = ("time_stats.attn_input_reshape.median,time_stats.attn_kv_cache_save.median,"
                "time_stats.attn_prefill.median,time_stats.attn_decode.median,time_stats.attn_output_reshape.median,"
                "n_embd,n_q_head,n_kv_head,block_size,num_tensor_parallel_workers,max_model_len,batch_size,"
                "prefill_chunk_size,kv_cache_size,is_prefill,attention_backend")
MLP_OPS = ("emb", *LAYER_OPS)
TOKENS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096)
LLAMA2_7B = (32, 32, 4096, 11008)  # n_head, n_kv_head, n_embd, n_expanded_embd
LLAMA2_70B = (64, 8, 8192, 28672)


def prefill_ms(chunk, prefix, tp):
    return (chunk + prefix / 64) / 1000 / tp


def decode_ms(batch, context, tp):
    return (5 + batch * context / 256) / 1000 / tp


def op_ms(op, tokens, tp):
    return (MLP_OPS.index(op) + 1) * (0.002 + tokens / 1e5) / (1 if op in ("input_layernorm", "add") else tp)


def vidur_folder(root, *, attention_tp=(1,), mlp_tp=(1,), vocab=32000, shape=LLAMA2_7B,
                 chunks=(64, 512), prefixes=(0, 1024), batches=(1, 8), contexts=(512, 2048),
                 where="compute/a100/org/Model"):
    """A Vidur model folder: every (chunk, prefix) prefill row and (batch, context) decode row at each
    attention degree, every token count at each MLP degree; ``vocab``: one, or one per MLP degree."""
    folder = root / where
    folder.mkdir(parents=True)
    heads, kv_heads, embd, ffn = shape
    mlp = [",".join([*(f"time_stats.{op}.median" for op in MLP_OPS), "n_head,n_kv_head,n_embd,n_expanded_embd,"
                     "vocab_size,use_gated_mlp,num_tokens,num_tensor_parallel_workers"])]
    for tp in mlp_tp:
        v = vocab[tp] if isinstance(vocab, dict) else vocab
        mlp += [",".join([*(repr(op_ms(op, n, tp)) for op in MLP_OPS), str(heads), str(kv_heads), str(embd),
                          str(ffn), str(v), "True", str(n), str(tp)]) for n in TOKENS]
    attn = [ATTN_COLUMNS]
    tail = f"{embd},{heads},{kv_heads},16,{{tp}},16384,{{batch}},{{chunk}},{{kv}},{{prefill}},AttentionBackend.FLASHINFER"
    for tp in attention_tp:
        attn += [f"0.0,0.0,{prefill_ms(c, p, tp)!r},0.0,0.0," + tail.format(tp=tp, batch=1, chunk=c, kv=p, prefill=True)
                 for c in chunks for p in prefixes]
        attn += [f"0.0,0.0,0.0,{decode_ms(b, k, tp)!r},0.0," + tail.format(tp=tp, batch=b, chunk=0, kv=k, prefill=False)
                 for b in batches for k in contexts]
    (folder / "mlp.csv").write_text("\n".join(mlp) + "\n")
    (folder / "attention.csv").write_text("\n".join(attn) + "\n")
    return folder


def step_s(model_spec, tp, *, chunk=0, prefix=0, batch=0, context=0):
    """A grid step's time from the formulas above (per-GPU tables at degree ``tp``, no all-reduce)."""
    tokens = chunk + batch
    dense = sum(model_spec.num_layers * op_ms(op, tokens, tp) for op in LAYER_OPS) + op_ms("emb", tokens, tp)
    attn = (prefill_ms(chunk, prefix, tp) if chunk else 0.0) + (decode_ms(batch, context, tp) if batch else 0.0)
    return (dense + model_spec.num_layers * attn) * 1e-3


def test_a_full_vidur_grid_is_stored_sparse(tmp_path):
    """200 chunks x 200 prefixes and 200 batches x 200 contexts: 80,000 rows on axes whose product
    is 201^4 = 1.6e9 cells. The grid holds the 80,000 points (a dense one would not fit in memory),
    the file lists them, and the model reads them exactly."""
    chunks, prefixes = tuple(range(16, 3201, 16)), tuple(range(32, 6401, 32))
    batches, contexts = tuple(range(1, 201)), tuple(range(16, 3201, 16))
    folder = vidur_folder(tmp_path, chunks=chunks, prefixes=prefixes, batches=batches, contexts=contexts)
    prof, _, _ = convert_vidur(folder)
    a = prof.tp[1].attention
    assert a.shape == (201, 201, 201, 201) and a.cells == 201 ** 4 == 1_632_240_801
    assert len(a.seconds) == len(a.points()) == 80_000  # the stored entries: the measured points only
    assert a.at(chunks.index(512) + 1, prefixes.index(1024) + 1, 0, 0) == prefill_ms(512, 1024, 1) * 1e-3
    assert a.at(0, 0, 8, contexts.index(1024) + 1) == decode_ms(8, 1024, 1) * 1e-3
    assert a.at(1, 1, 1, 1) is None and a.at(0, 1, 0, 0) is None  # no mixed point, no prefix without a chunk
    attention = prof.to_dict()["tp"][1]["attention"]
    assert "time_us" not in attention and len(attention["points"]["time_us"]) == 80_000
    pts = attention["points"]  # C order: the decode points (chunk 0) first
    assert (pts["prefill_chunk"][:2], pts["n_decode"][:2], pts["kv_decode"][:2]) == ([0, 0], [1, 1], [16, 32])
    assert (pts["prefill_chunk"][-1], pts["kv_prefill"][-1], pts["n_decode"][-1]) == (3200, 6400, 0)
    spec = MODELS["llama-2-7b"]
    m = ProfiledCostModel(prof, Deployment(spec, GPUS["a100-80gb"]), chunk_tile=256)
    decode = BatchShape(decode_seqs=64, decode_context=64 * 2048)
    assert m.step_time(decode) == pytest.approx(step_s(spec, 1, batch=64, context=2048), rel=1e-12)
    prefill = BatchShape(prefill_seqs=1, prefill_tokens=1024, prefill_attn_pairs=causal_attention_pairs(1024, 4096))
    assert m.step_time(prefill) == pytest.approx(step_s(spec, 1, chunk=1024, prefix=4096), rel=1e-12)
    assert not m.out_of_grid


def test_a_sparse_profile_round_trips_through_yaml_and_the_binary_copy(tmp_path, monkeypatch):
    monkeypatch.setattr(op, "_CACHE", {})
    monkeypatch.setattr(profile_cache, "MIN_BYTES", 0)  # copy it, however small
    monkeypatch.setenv("KVSIM_CACHE_DIR", str(tmp_path / "cache"))
    folder = vidur_folder(tmp_path, chunks=(16, 64, 128, 256, 512, 1024), prefixes=(0, 256, 1024, 4096, 8192),
                          batches=(1, 2, 4, 8, 16, 32, 64), contexts=(128, 512, 1024, 2048, 4096, 8192))
    converted, _, _ = convert_vidur(folder)
    path = import_vidur(folder, tmp_path / "out")
    text = path.read_text()
    assert "      points:\n        prefill_chunk: [0, 0, 0," in text and "null" not in text
    pts = yaml.safe_load(text)["tp"][1]["attention"]["points"]
    assert pts["prefill_chunk"].count(0) == 7 * 6 and pts["prefill_chunk"][-5:] == [1024] * 5
    assert pts["kv_prefill"][-5:] == [0, 256, 1024, 4096, 8192] and pts["time_us"][-1] == round((1024 + 8192 / 64), 6)
    from_yaml = read_operator_profile(path)
    copy = profile_cache.beside(path)
    assert copy.is_file()
    op._CACHE.clear()  # as a new process would: read from the binary copy, the YAML not parsed

    def refuse(*args, **kwargs):
        raise AssertionError("the YAML was parsed")

    monkeypatch.setattr(op.yaml, "load", refuse)
    from_copy = read_operator_profile(path)
    assert from_yaml == from_copy and from_yaml.to_dict() == converted.to_dict()  # (the file's microseconds)
    assert len(from_copy.tp[1].attention.seconds) == 6 * 5 + 7 * 6 < from_copy.tp[1].attention.cells == 7 * 5 * 8 * 7
    shapes = [BatchShape(decode_seqs=n, decode_context=n * kd) for n in (1, 3, 40, 100) for kd in (100, 700, 9000)]
    shapes += [BatchShape(prefill_seqs=s, prefill_tokens=s * c, prefill_attn_pairs=s * causal_attention_pairs(c, p),
                          decode_seqs=n, decode_context=n * 1500)
               for s in (1, 2) for c in (16, 100, 700, 3000) for p in (0, 300, 5000) for n in (0, 12)]
    spec = MODELS["llama-2-7b"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ProfileExtrapolationWarning)
        times = [[ProfiledCostModel(p, Deployment(spec, GPUS["a100-80gb"])).step_time(s) for s in shapes]
                 for p in (converted, from_yaml, from_copy)]
    assert times[1] == times[2]  # the YAML's and the copy's: identical, not approximately
    assert times[0] == pytest.approx(times[1], rel=1e-12)  # the converted profile's, before microseconds were written
    d = BatchShape(decode_seqs=8, decode_context=8 * 1024)
    assert ProfiledCostModel(from_copy, Deployment(spec, GPUS["a100-80gb"])).step_time(d) == pytest.approx(
        step_s(spec, 1, batch=8, context=1024), rel=1e-12)


def test_dense_and_sparse_files_read_to_the_same_grid(tmp_path):
    shipped = read_operator_profile(PROFILES_DIR / f"{NAME}.yaml")  # written dense
    a = shipped.tp[1].attention
    assert yaml.safe_load((PROFILES_DIR / f"{NAME}.yaml").read_text())["tp"][1]["attention"]["time_us"][0] is None
    assert a.sparse_in_file() and len(a.seconds) == 39 and a.cells == 4 * 6 * 9 * 4
    again = read_operator_profile(write_operator_profile(shipped, tmp_path / "sparse.yaml"))
    assert "points" in yaml.safe_load((tmp_path / "sparse.yaml").read_text())["tp"][1]["attention"]
    assert again.tp == shipped.tp and again.tp[1].attention.points() == a.points()
    dense = AttentionGrid((0, 16), (0,), (0, 1), (0, 8), (None, None, None, 2e-6, 1e-6, None, None, None))
    assert dense.seconds == {(0, 0, 1, 1): 2e-6, (1, 0, 0, 0): 1e-6} and dense.at(0, 0, 1, 1) == 2e-6
    assert dense == AttentionGrid((0, 16), (0,), (0, 1), (0, 8), {(1, 0, 0, 0): 1e-6, (0, 0, 1, 1): 2e-6})
    assert not dense.sparse_in_file()  # 2 points: 10 numbers against 8 cells
    assert dense.points() == [(0, 0, 1, 8, 2e-6), (16, 0, 0, 0, 1e-6)]
    with pytest.raises(ValueError, match="outside the axes"):
        AttentionGrid((0, 16), (0,), (0, 1), (0, 8), {(2, 0, 0, 0): 1.0})


@pytest.mark.parametrize("edit, message", [
    (lambda att: att["points"]["kv_decode"].__setitem__(0, 7), r"tp.1.attention.points.kv_decode: 7 is not a value"),
    (lambda att: att["points"]["n_decode"].pop(), r"tp.1.attention.points.n_decode: expected a list of 39 values"),
    (lambda att: att.__setitem__("time_us", [1.0]), r"tp.1.attention: expected either time_us \(dense\) or points"),
    (lambda att: [att["points"][k].__setitem__(1, att["points"][k][0]) for k in att["points"]],
     r"tp.1.attention.points: a point is listed more than once"),
    (lambda att: att["points"]["time_us"].__setitem__(3, None), r"tp.1.attention.points.time_us: expected times >= 0"),
])
def test_a_bad_sparse_grid_is_one_line_naming_the_key(tmp_path, edit, message):
    path = write_operator_profile(read_operator_profile(PROFILES_DIR / f"{NAME}.yaml"), tmp_path / "p.yaml")
    data = yaml.safe_load(path.read_text())
    edit(data["tp"][1]["attention"])
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(OperatorProfileError, match=message) as e:
        read_operator_profile(path)
    assert "\n" not in str(e.value)


def test_a_folder_profiled_at_tp_2_and_4_only(tmp_path):
    """Like Vidur's Llama-2-70B folders: no degree 1 in attention.csv. The shared degrees are imported
    (mlp.csv's degree 8 has no attention rows: dropped); a TP-2 run reads the TP-2 tables; a TP-1 run
    is refused in one line naming the degrees the profile has."""
    folder = vidur_folder(tmp_path, attention_tp=(2, 4), mlp_tp=(2, 4, 8), vocab=32768, shape=LLAMA2_70B,
                          where="compute/a100/meta-llama/Llama-2-70b-hf")
    path = import_vidur(folder, tmp_path / "out")
    prof = read_operator_profile(path)
    assert sorted(prof.tp) == [2, 4] and "degrees 2, 4 only" in prof.provenance["notes"]
    spec = MODELS["llama-2-70b"]
    for tp in (2, 4):
        m = ProfiledCostModel(prof, Deployment(spec, GPUS["a100-80gb"], tensor_parallel=tp))
        assert m.tp_source == f"tp{tp} tables"
        shape = BatchShape(decode_seqs=8, decode_context=8 * 2048)
        assert m.step_time(shape) == pytest.approx(step_s(spec, tp, batch=8, context=2048)
                                                   + m.allreduce_time(8), rel=1e-12)
    message = (r"^cost_model.profile: a100-llama-2-70b-hf has tensor-parallel degrees 2, 4 only, not 1 "
               r"\(and no degree 1 to scale from\): run at one of 2, 4$")
    with pytest.raises(OperatorProfileError, match=message):
        ProfiledCostModel(prof, Deployment(spec, GPUS["a100-80gb"]))
    with pytest.raises(OperatorProfileError, match=message.replace("not 1", "not 8")):
        profiled_cost_factory(path, None, Deployment(spec, GPUS["a100-80gb"], tensor_parallel=8))
    # files that share no degree: refused, naming each file's
    with pytest.raises(VidurFormatError, match=r"share no tensor-parallel degree \(mlp.csv: 1, 8, attention.csv: 2, 4\)$"):
        convert_vidur(vidur_folder(tmp_path, attention_tp=(2, 4), mlp_tp=(1, 8), where="compute/a100/org/Other"))


def test_a_run_at_a_degree_the_profile_lacks_is_one_line(tmp_path, capsys):
    folder = vidur_folder(tmp_path, attention_tp=(2,), mlp_tp=(2,), vocab=32768, shape=LLAMA2_70B,
                          where="compute/a100/meta-llama/Llama-2-70b-hf")
    path = import_vidur(folder, tmp_path / "out")
    cfg = sharegpt_config(tmp_path, name="tp1", model="llama-2-70b", gpu="a100-80gb", rate=4.0, num_requests=4,
                          cost_model={"kind": "profiled", "profile": str(path)})
    cfg["hardware"]["kv_cache_gib"] = 4  # (70B's weights fill one GPU)
    config = tmp_path / "run.json"
    config.write_text(json.dumps(cfg))
    assert kvsim(["run", str(config)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "has tensor-parallel degrees 2 only, not 1" in err


def test_padded_vocabularies():
    assert padded_vocab_sizes(32000) == (32000, 32768)  # Vidur's Llama-2 configs: the next power of two
    assert padded_vocab_sizes(50257) == (50257, 50304, 65536)  # sarathi-serve's multiple of 64, the power of two
    assert padded_vocab_sizes(128256) == (128256, 131072)
    assert padded_vocab_sizes(65536) == (65536,)


def test_a_padded_vocabulary_is_accepted_and_recorded(tmp_path):
    prof, _, _ = convert_vidur(vidur_folder(tmp_path, vocab=32768, where="compute/a100/meta-llama/Llama-2-7b-hf"))
    assert prof.model["vocab_size"] == 32768 and prof.model["unpadded_vocab_size"] == 32000
    assert "vocab_size 32768 is the vocabulary Vidur's profiler ran, the model's 32000 padded" in prof.provenance["notes"]
    check_profile_model(prof, MODELS["llama-2-7b"])  # 32,000 padded to 32,768: accepted
    spec = MODELS["llama-2-7b"]
    m = ProfiledCostModel(prof, Deployment(spec, GPUS["a100-80gb"]))
    assert m.step_time(BatchShape(decode_seqs=8, decode_context=8 * 512)) == pytest.approx(
        step_s(spec, 1, batch=8, context=512), rel=1e-12)
    # not a padding of 32,000: refused as before, in one line
    odd, _, _ = convert_vidur(vidur_folder(tmp_path, vocab=33000, where="compute/a100/org/Odd"))
    assert "unpadded_vocab_size" not in odd.model
    with pytest.raises(OperatorProfileError, match=r"^cost_model.profile: a100-odd was measured for org/Odd shapes; "
                       r"model Llama-2-7B differs \(vocab_size 33000 vs 32000 \(padded: 32768\)\): "
                       r"choose a profile of this model$"):
        check_profile_model(odd, MODELS["llama-2-7b"])
    with pytest.raises(OperatorProfileError, match=r"vocab_size 32768 vs 128256 \(padded: 131072\)"):
        check_profile_model(prof, MODELS["llama-3-8b"].__class__(**{**MODELS["llama-3-8b"].__dict__,
                                                                   "num_kv_heads": 32, "ffn_size": 11008}))


def test_degrees_that_differ_only_in_vocabulary(tmp_path):
    folder = vidur_folder(tmp_path, attention_tp=(1, 2), mlp_tp=(1, 2), vocab={1: 32000, 2: 32768})
    prof = read_operator_profile(import_vidur(folder, tmp_path / "out"))  # through the YAML (int keys kept)
    assert prof.model["vocab_size"] == 32000 and prof.model["vocab_size_by_tp"] == {1: 32000, 2: 32768}
    assert "unpadded_vocab_size" not in prof.model and "tp1 32000, tp2 32768" in prof.provenance["notes"]
    check_profile_model(prof, MODELS["llama-2-7b"])
    wrong = read_operator_profile(import_vidur(vidur_folder(tmp_path, attention_tp=(1, 2), mlp_tp=(1, 2),
                                                            vocab={1: 32000, 2: 40000}, where="compute/a/o/W"),
                                               tmp_path / "out"))
    with pytest.raises(OperatorProfileError, match=r"vocab_size 40000 vs 32000 \(padded: 32768\)"):
        check_profile_model(wrong, MODELS["llama-2-7b"])
    # within one degree the rows must agree
    bad = vidur_folder(tmp_path, where="compute/a/o/Bad")
    lines = (bad / "mlp.csv").read_text().splitlines()
    lines[3] = lines[3].replace(",32000,True,", ",32768,True,")
    (bad / "mlp.csv").write_text("\n".join(lines) + "\n")
    with pytest.raises(VidurFormatError, match=r"mlp.csv:4: vocab_size 32768 differs from 32000 in the rows of "
                                               r"tensor-parallel degree 1 \(one vocabulary per degree\)$"):
        convert_vidur(bad)
