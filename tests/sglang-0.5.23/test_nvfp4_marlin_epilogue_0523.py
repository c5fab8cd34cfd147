"""The one Marlin epilogue kernel on the 0.5.23 line (line patch 0010): padding, the fused
shards' column scale and the bias after the NVFP4 Marlin GEMM.

The pin's tests (tests/sglang/test_nvfp4_marlin_epilogue.py, which says what each proves) run
here against 0.5.23's code, whose ``apply_fp4_marlin_linear`` is the registered op itself and
whose layers carry the column scale and the bias padded to the Marlin tile. On bare v0.5.23
every test fails: there is no ``nvfp4_marlin_epilogue``.
"""

from __future__ import annotations

from test_nvfp4_marlin_epilogue import (  # noqa: F401 (fixtures and tests, collected here)
    ep,
    test_a_strided_output_is_not_written_in_place,
    test_apply_runs_one_epilogue_after_marlin,
    test_in_place_without_padding_and_nothing_to_do,
    test_kernel_is_the_float32_ops,
    test_off_cuda_the_float32_ops_run,
    test_the_kernel_runs_from_sm80,
    test_wrong_vectors_are_named,
)


def test_apply_slices_the_padded_vectors(ep, monkeypatch):  # noqa: F811 (the fixture)
    """0.5.23 pads a padded shard's bias and column scale to the Marlin tile when it prepares
    the layer: the linear hands the kernel their first size_n entries (unsliced, the kernel's
    wrapper refuses their length; the tail here is NaN)."""
    import importlib

    import torch
    from test_nvfp4_marlin_epilogue import BF16, MARLIN_FP4, _assert_rounded_once, _case

    m = importlib.import_module(MARLIN_FP4)
    marlin_out, scale, bias = _case(BF16, 2, 1000, 1024, seed=5)
    nan = torch.full((24,), float("nan"))
    padded_scale, padded_bias = torch.cat([scale, nan]), torch.cat([bias, nan.to(BF16)])
    monkeypatch.setattr(m, "gptq_marlin_gemm", lambda **kw: marlin_out.clone(), raising=False)
    monkeypatch.setattr(m, "use_dequant_gemm", lambda *a: False)
    got = m.apply_fp4_marlin_linear(
        torch.zeros(2, 256, dtype=BF16), torch.zeros(16, 2048, dtype=torch.int32),
        torch.zeros(16, 1024, dtype=torch.float8_e4m3fn), torch.ones(1, dtype=BF16),
        torch.zeros(1, dtype=torch.int32), 1000, 256, padded_bias, output_scale=padded_scale,
    )  # fmt: skip
    _assert_rounded_once(got, marlin_out[:, :1000].float() * scale + bias.float(), BF16)
    assert ep.launches == [(2, 1)]
