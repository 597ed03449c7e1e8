"""Layers by kind (simulator/cost_model/layers.py): exact KV bytes checked by hand against the
catalogue's published shapes, the full-attention baseline kept, KV dtypes, capacity and the
roofline's traffic by kind, the config's layer pattern and its one-line errors."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvsim.simulator.capacity import block_bytes_per_gpu
from kvsim.simulator.config import ConfigError, load_config
from kvsim.simulator.cost_model.base import BatchShape
from kvsim.simulator.cost_model.catalogue import GPUS, MODELS
from kvsim.simulator.cost_model.hybrid_table import main as table_main
from kvsim.simulator.cost_model.hybrid_table import table
from kvsim.simulator.cost_model.layers import (
    KV_DTYPES,
    ChunkedLocal,
    FullAttention,
    LayerPatternError,
    NoMixer,
    RecurrentState,
    SharedKV,
    SlidingWindow,
    expand,
    from_codes,
    gated_deltanet_state_bytes,
    mamba2_state_bytes,
    mamba_state_bytes,
    request_kv_bytes,
    tokens_kept,
)
from kvsim.simulator.cost_model.roofline import RooflineCostModel

ROOT = Path(__file__).resolve().parents[3]
FULL_ATTENTION_MODELS = [n for n in MODELS if n not in {
    "gpt-oss-20b", "gpt-oss-120b", "gemma-3-12b", "gemma-3-27b", "llama-4-scout", "qwen3-next-80b-a3b",
    "nemotron-h-8b", "jamba-1.5-mini", "deepseek-v3"}]


# --- exact bytes, by hand -------------------------------------------------------------------

def test_state_sizes_by_hand():
    # Qwen3-Next Gated DeltaNet: conv over 2 x 16 x 128 + 32 x 128 = 8,192 channels x 3 inputs,
    # 32 value heads of a 128 x 128 matrix; bf16
    assert gated_deltanet_state_bytes(16, 32, 128, 128, 4) == (3 * 8192 + 32 * 128 * 128) * 2 == 1_097_728
    # Nemotron-H-8B Mamba-2: conv over 128 x 64 + 2 x 8 x 128 = 10,240 channels x 3; SSM 128 x 64 x 128
    assert mamba2_state_bytes(128, 64, 128, 8, 4) == (3 * 10240 + 128 * 64 * 128) * 2 == 2_158_592
    # Jamba Mamba: d_inner 8,192: conv 3 x 8,192, SSM 8,192 x 16
    assert mamba_state_bytes(8192, 16, 4) == (3 * 8192 + 8192 * 16) * 2 == 311_296
    assert mamba_state_bytes(8192, 16, 4, conv_bytes=2, ssm_bytes=4) == 3 * 8192 * 2 + 8192 * 16 * 4


def test_gpt_oss_20b_bytes_by_hand():
    m = MODELS["gpt-oss-20b"]
    token = 2 * 8 * 64 * 2  # K and V, 8 KV heads of 64, bf16: 2,048 bytes a layer
    assert m.request_kv_bytes(1000) == 12 * 1000 * token + 12 * 128 * token == 27_721_728
    assert m.request_kv_bytes(100) == 24 * 100 * token  # inside the window: every layer keeps all
    assert m.kv_bytes_per_token == 24 * token == 49_152  # the baseline: as before layers had kinds


def test_qwen3_next_bytes_by_hand():
    m = MODELS["qwen3-next-80b-a3b"]
    token = 2 * 2 * 256 * 2  # 2 KV heads of 256
    assert [type(k) for k in m.layer_kinds[:4]] == [RecurrentState] * 3 + [FullAttention]
    assert m.request_kv_bytes(1000) == 12 * 1000 * token + 36 * 1_097_728 == 64_094_208
    assert m.request_kv_bytes(0) == 0  # no request, no state
    assert m.naive_request_kv_bytes(1000) == 1000 * 48 * token


def test_nemotron_h_8b_bytes_by_hand():
    m = MODELS["nemotron-h-8b"]
    assert sum(isinstance(k, FullAttention) for k in m.layer_kinds) == 4
    assert sum(isinstance(k, NoMixer) for k in m.layer_kinds) == 24
    assert m.request_kv_bytes(1000) == 4 * 1000 * (2 * 8 * 128 * 2) + 24 * 2_158_592 == 68_190_208


def test_llama_4_scout_keeps_the_current_chunk():
    m, token = MODELS["llama-4-scout"], 2 * 8 * 128 * 2
    assert m.request_kv_bytes(10_000) == 12 * 10_000 * token + 36 * 1808 * token  # 10,000 - 8,192
    assert m.request_kv_bytes(8192) == 48 * 8192 * token  # the first chunk is whole
    assert m.request_kv_bytes(8193) == 12 * 8193 * token + 36 * 1 * token  # a new chunk begins


def test_gemma_3_27b_five_local_one_global():
    m, token = MODELS["gemma-3-27b"], 2 * 16 * 128 * 2
    globals_ = [i for i, k in enumerate(m.layer_kinds) if isinstance(k, FullAttention)]
    assert globals_ == [5, 11, 17, 23, 29, 35, 41, 47, 53, 59]  # (i + 1) % 6 == 0; 60, 61 local
    assert m.request_kv_bytes(2048) == 10 * 2048 * token + 52 * 1024 * token


def test_jamba_and_deepseek_by_hand():
    j = MODELS["jamba-1.5-mini"]
    assert [i for i, k in enumerate(j.layer_kinds) if isinstance(k, FullAttention)] == [4, 12, 20, 28]
    assert j.request_kv_bytes(100) == 4 * 100 * (2 * 8 * 128 * 2) + 28 * 311_296
    d = MODELS["deepseek-v3"]  # MLA: a 576-value latent a layer, bf16; every layer keeps every token
    assert d.kv_bytes_per_token == 61 * 576 * 2 == 70_272
    assert d.request_kv_bytes(1000) == d.naive_request_kv_bytes(1000) == 1000 * 70_272


def test_tokens_kept_by_kind():
    assert [tokens_kept(SlidingWindow(4), t) for t in (0, 1, 4, 5, 9)] == [0, 1, 4, 4, 4]
    assert [tokens_kept(ChunkedLocal(4), t) for t in (0, 1, 4, 5, 8, 9)] == [0, 1, 4, 1, 4, 1]
    assert [tokens_kept(k, 7) for k in (FullAttention(), RecurrentState(9), SharedKV(0), NoMixer())] == [7, 0, 0, 0]


kinds = st.one_of(st.just(FullAttention()), st.builds(SlidingWindow, st.integers(1, 64)),
                  st.builds(ChunkedLocal, st.integers(1, 64)))


@given(st.lists(st.tuples(kinds, st.integers(1, 4)), min_size=1, max_size=5), st.integers(1, 40),
       st.integers(0, 300))
def test_exact_never_exceeds_the_full_attention_count(runs, num_layers, tokens):
    layers = expand(runs, num_layers)
    exact = request_kv_bytes(layers, tokens, 2, 8, KV_DTYPES["bf16"])
    assert exact <= tokens * num_layers * 2 * 2 * 8 * 2
    spans = [getattr(k, "window", getattr(k, "chunk", tokens)) for k in layers]
    if tokens <= min(spans):  # within every window and the first chunk: every layer keeps all
        assert exact == tokens * num_layers * 2 * 2 * 8 * 2


# --- the baseline and the dtype --------------------------------------------------------------

@pytest.mark.parametrize("name", FULL_ATTENTION_MODELS)
def test_full_attention_models_are_charged_as_before(name):
    m = MODELS[name]
    assert m.layer_kinds == (FullAttention(),) * m.num_layers
    assert m.kv_bytes_per_token == 2 * m.num_layers * m.num_kv_heads * m.head_dim * m.dtype_bytes
    assert m.request_kv_bytes(777) == m.naive_request_kv_bytes(777) == 777 * m.kv_bytes_per_token
    for tp in (1, 2, 8):  # capacity's block: as before, per GPU's KV heads
        kv = -(-m.num_kv_heads // tp)
        assert block_bytes_per_gpu(m, tp, 16) == 16 * 2 * m.num_layers * kv * m.head_dim * m.dtype_bytes


def test_kv_dtypes():
    from dataclasses import replace

    m = MODELS["llama-3.1-8b"]
    fp8, int4 = replace(m, kv_dtype=KV_DTYPES["fp8"]), replace(m, kv_dtype=KV_DTYPES["int4"])
    assert fp8.kv_bytes_per_token * 2 == m.kv_bytes_per_token == 131_072
    assert block_bytes_per_gpu(fp8, 1, 16) * 2 == block_bytes_per_gpu(m, 1, 16)
    # int4: 128 values in 64 bytes, plus an fp16 scale and zero point per head and token
    assert KV_DTYPES["int4"].vector_bytes(128) == 64 + 4
    assert int4.kv_bytes_per_token == 2 * 32 * 8 * 68 == 34_816
    d = replace(MODELS["deepseek-v3"], kv_dtype=KV_DTYPES["fp8"])  # MLA in fp8: the latent halves
    assert d.kv_bytes_per_token == 61 * 576 and block_bytes_per_gpu(d, 8, 64) == 64 * 61 * 576
    assert m.weight_bytes == fp8.weight_bytes  # the KV dtype leaves the weights alone


def test_gemma_ties_its_embeddings():
    g = MODELS["gemma-3-12b"]
    untied = g.__class__(**{**g.__dict__, "tie_word_embeddings": False})
    assert untied.num_params - g.num_params == 262208 * 3840


# --- the roofline by layer kind ----------------------------------------------------------------

# Step times of full-attention models are the ones before layers had kinds (values of the roofline
# before this change, on the same shapes): byte for byte.
@pytest.mark.parametrize(("name", "gpu", "tp", "expected"), [
    ("llama-3.1-8b", "h100-sxm", 1, (0.008952144298447342, 0.028065338960434005)),
    ("deepseek-v3", "h200", 8, (0.008630410864362694, 0.037130750714540126)),
])
def test_full_attention_step_times_unchanged(name, gpu, tp, expected):
    c = RooflineCostModel(MODELS[name], GPUS[gpu], tp)
    shapes = (BatchShape(decode_seqs=8, decode_context=8 * 3000),
              BatchShape(prefill_seqs=2, prefill_tokens=1500, prefill_attn_pairs=1500 * 1501 / 2 + 1500 * 300,
                         decode_seqs=3, decode_context=9000))
    assert tuple(c.step_time(s) for s in shapes) == expected


def test_window_layers_read_at_most_their_window():
    c = RooflineCostModel(MODELS["gpt-oss-20b"], GPUS["h100-sxm"])
    (span, window_s, _), = c._spans
    assert span == 128 and c.groups.context_layers == 12 and c.groups.context_bytes == 12 * 2048
    step = lambda n, ctx: c.step_time(BatchShape(decode_seqs=n, decode_context=ctx))  # noqa: E731
    # past the window, a token more of context costs only the full layers' read
    assert step(2, 2001) - step(2, 2000) == pytest.approx(c._decode_token_s)
    assert step(2, 201) - step(2, 200) == pytest.approx(c._decode_token_s + window_s)  # within 2 x 128
    assert step(2, 2000) - step(2, 256) == pytest.approx(c._decode_token_s * 1744)
    for n, ctx in ((2, 100), (2, 255), (2, 256), (3, 5000), (1, 1)):  # the closed form holds per segment
        a, b, steps = c.decode_segment(n, ctx)
        for i in range(min(steps, 50)):
            assert a + b * (ctx + n * i) == pytest.approx(step(n, ctx + n * i), rel=1e-12)
    assert c.decode_segment(2, 100)[2] == 78  # 100, 102, ..., 254: then the edge, 256


def test_state_layers_read_and_write_their_state_each_step():
    m = MODELS["qwen3-next-80b-a3b"]
    c = RooflineCostModel(m, GPUS["h100-sxm"], 2)
    bw = GPUS["h100-sxm"].hbm_bandwidth * c.params.memory_efficiency
    assert c.groups.state_bytes == 36 * 1_097_728
    shape = BatchShape(decode_seqs=5, decode_context=5 * 4000)
    assert c.bounded_attention_time(shape) == pytest.approx(5 * 2 * 36 * 1_097_728 / 2 / bw)


def test_prefill_window_pairs_are_bounded():
    c = RooflineCostModel(MODELS["gemma-3-12b"], GPUS["h100-sxm"])
    (span, _, pair_s), = c._spans
    shape = BatchShape(prefill_seqs=1, prefill_tokens=4096, prefill_attn_pairs=4096 * 4097 / 2)
    assert c.bounded_attention_time(shape) == pytest.approx(pair_s * 4096 * 1024)


# --- the config ---------------------------------------------------------------------------------

BASE = """name: hyb
model:
  name: hyb
  shape:
    num_layers: 6
    hidden_size: 1024
    num_heads: 8
    num_kv_heads: 2
    intermediate_size: 2048
    vocab_size: 32000
    context_len_tokens: 8192
    layers:
      pattern:
        - {kind: sliding_window, window_tokens: 512, count: 5}
        - {kind: full_attention}
hardware:
  gpu: a100-80gb
workload:
  arrivals: {kind: poisson, rate: 1.0}
  lengths: {kind: preset, name: sharegpt-paper}
  num_requests: 10
"""


@pytest.fixture
def hybrid_yaml(tmp_path) -> Path:
    path = tmp_path / "hyb.yaml"
    path.write_text(BASE)
    return path


def test_a_config_describes_layers_and_kv_dtype(hybrid_yaml):
    cfg, _ = load_config(hybrid_yaml, ["model.kv_cache_dtype=fp8"])
    m = cfg.model.spec
    assert m.layer_kinds == (SlidingWindow(512),) * 5 + (FullAttention(),)
    token = 2 * 2 * 128 * 1  # fp8
    assert m.kv_bytes_per_token == 6 * token
    assert m.request_kv_bytes(1000) == 5 * 512 * token + 1000 * token
    assert load_config(hybrid_yaml)[0].model.spec.kv_cache_dtype.name == "bf16"


@pytest.mark.parametrize(("override", "message"), [
    ("model.shape.layers.pattern.0.window_tokens=null",
     "model.shape.layers.pattern.0: kind sliding_window needs window_tokens"),
    ("model.shape.layers.pattern.1.window_tokens=3",
     "model.shape.layers.pattern.1: window_tokens is read by kind sliding_window, not full_attention: remove it"),
    ("model.kv_cache_dtype=int8",
     "model.kv_cache_dtype: Input should be 'auto', 'bf16', 'fp16', 'fp8' or 'int4' (got 'int8')"),
    ("model.shape.layers.repeat=false", None),  # 5 + 1 = 6 layers: fine
    ("model.shape.layers.pattern.0.count=4",  # 4 + 1 layers, repeated and cut at 6
     None),
    ("model.shape.layers.pattern.1.kind=mamba2",
     "model.shape.layers.pattern.1: kind mamba2 needs num_heads, head_dim, d_state, n_groups, d_conv"),
])
def test_layer_errors_are_one_line_naming_the_key(hybrid_yaml, override, message):
    if message is None:
        load_config(hybrid_yaml, [override])
        return
    with pytest.raises(ConfigError) as e:
        load_config(hybrid_yaml, [override])
    text = str(e.value)
    assert "\n" not in text and text.endswith(message), text


def test_a_pattern_that_does_not_fit_is_one_line(hybrid_yaml):
    with pytest.raises(ConfigError) as e:
        load_config(hybrid_yaml, ["model.shape.layers.repeat=false", "model.shape.layers.pattern.0.count=4"])
    assert str(e.value).endswith("model.shape: layers.pattern: the pattern has 5 layers but the model 6: make them "
                                 "equal, or repeat the pattern"), str(e.value)
    bad = BASE.replace("{kind: full_attention}", "{kind: shared_kv, source_layer: 7}")
    hybrid_yaml.write_text(bad)
    with pytest.raises(ConfigError) as e:
        load_config(hybrid_yaml)
    assert str(e.value).endswith("layers.pattern: layer 5 shares the KV of layer 7: it must be an earlier layer "
                                 "(0 to 4)"), str(e.value)


def test_pattern_helpers_refuse_what_cannot_be():
    with pytest.raises(LayerPatternError, match="not in the legend"):
        from_codes("M*x", {"M": NoMixer(), "*": FullAttention()})
    with pytest.raises(LayerPatternError, match="stores no KV of its own"):
        expand(((NoMixer(), 1), (SharedKV(0), 1)), 2)
    with pytest.raises(LayerPatternError, match="at least 1"):
        expand(((SlidingWindow(0), 1),), 2)
    assert expand(((FullAttention(), 1), (SharedKV(0), 1)), 2)[1] == SharedKV(0)


# --- the README table ---------------------------------------------------------------------------

def test_the_readme_shows_the_table(capsys):
    readme = (ROOT / "README.md").read_text()
    for row in table().splitlines():
        assert row in readme, row
    assert table_main([]) == 0 and capsys.readouterr().out.strip() == table()
    with pytest.raises(SystemExit):
        table_main(["--tokens", "1k"])
