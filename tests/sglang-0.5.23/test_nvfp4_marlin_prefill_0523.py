"""The NVFP4 prefill path on the 0.5.23 line (line patch 0009): dequantize + cuBLAS at
prefill sizes on SM90.

The pin's tests (tests/sglang/test_nvfp4_marlin_prefill.py, which says what each proves) run
here against 0.5.23's code: its ``prepare_nvfp4_layer_for_marlin`` (only the CUDA repack
replaced by the layout model) and its ``apply_fp4_marlin_linear``, which is the registered op
itself there. On bare v0.5.23 every test fails: there is no ``nvfp4_marlin_prefill``.
"""

from __future__ import annotations

from test_nvfp4_marlin_prefill import (  # noqa: F401 (fixtures and tests, collected here)
    m,
    pf,
    test_apply_fp4_marlin_linear_takes_the_dequant_path,
    test_apply_takes_the_path_from_the_threshold,
    test_dequant_chunk_rows_fit_the_scratch,
    test_dequant_gemm_over_several_chunks_with_bias,
    test_dequant_gives_the_checkpoint_weights,
    test_dequant_of_a_chunk_and_its_column_scales,
    test_dequant_path_only_where_measured,
    test_dequant_refuses_what_the_layout_does_not_hold,
)
