"""Both decode-attention entry points take the same keyword options and hand every one of
them to the launch (Triton interpreter, CPU tensors)."""

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from kvsim.gpu_validation.paged_attention import (  # noqa: E402
    DecodeConfig,
    contiguous_decode_attention,
    paged_decode_attention,
)
from kvsim.gpu_validation.reference import reference_contiguous_decode_attention  # noqa: E402


def contiguous_case(lens=(5, 16, 1), q_heads=4, kv_heads=2, head_dim=16):
    g = torch.Generator().manual_seed(3)
    k, v = (torch.randn(len(lens), max(lens), kv_heads, head_dim, generator=g) for _ in range(2))
    q = torch.randn(len(lens), q_heads, head_dim, generator=g)
    return q.half(), k.half(), v.half(), torch.tensor(lens, dtype=torch.int32)


def as_paged(k):
    """Contiguous K as a paged cache: block ``s`` is sequence ``s``, one block each."""
    return torch.arange(k.shape[0], dtype=torch.int32)[:, None]


@pytest.mark.parametrize("kernel", ["paged", "contiguous"])
def test_every_option_reaches_the_launch(kernel):
    q, k, v, lens = contiguous_case()  # 16 tokens at most: paged, a block of 16

    def run(**options):
        if kernel == "paged":
            return paged_decode_attention(q, k, v, as_paged(k), lens, **options)
        return contiguous_decode_attention(q, k, v, lens, **options)

    out = torch.full_like(q, float("nan"))
    got = run(scale=0.5, max_context_len=16, num_splits=2, config=DecodeConfig(tile=16), out=out)
    assert got is out  # written into the caller's buffer
    ref = reference_contiguous_decode_attention(q, k, v, lens, scale=0.5)
    assert (got.float() - ref.float()).abs().max().item() < 2e-3  # the given scale was used
    assert (run().float() - ref.float()).abs().max().item() > 1e-2  # default 1/sqrt(16) differs
    with pytest.raises(TypeError, match="num_split"):
        run(num_split=2)  # a misspelt option is an error, not ignored
