"""The speed models of serve/make_checkpoints.py (dense-large, moe-large) at --tiny size, CPU.

Checks the folders and make.json, the FP8 tensors against what SGLang's FP8 loaders create
(names, dtypes, shapes), and, where the (patched) pin is importable, that its config parsers
select the FP8 schemes for a linear layer and a FusedMoE layer on a (mocked) SM90 GPU. The ModelOpt
parts need nvidia-modelopt (.work/ckpt-venv, see serve/make-checkpoints.sh) and skip without it.
"""

import functools
import importlib.util
import json
import sys
import types

import pytest
import torch

pytest.importorskip("compressed_tensors", reason="compressed-tensors not installed")
pytest.importorskip("tokenizers", reason="tokenizers not installed")
import make_checkpoints as mc  # noqa: E402

HAS_MODELOPT = importlib.util.find_spec("modelopt") is not None
needs_modelopt = pytest.mark.skipif(
    not HAS_MODELOPT,
    reason="nvidia-modelopt not installed (serve/make-checkpoints.sh puts it in .work/ckpt-venv)",
)
EXPERTS, HIDDEN, MOE_INTER, LAYERS = 8, 256, 128, 2  # the --tiny shapes
O_PROJ = "model.layers.0.self_attn.o_proj"
EXPERTS_PREFIX = "model.layers.0.mlp.experts"
MADE = ("dense-large", "moe-large")  # dense-8b is dense-large at --tiny size


@pytest.fixture(scope="module")
def out(tmp_path_factory):
    root = tmp_path_factory.mktemp("large")
    args = ["--out", str(root), "--tiny", "--models", ",".join(MADE)]
    assert mc.main([*args, "--corpus-kb", "700", "--vocab", "512"]) == 0
    return root / "tiny"


def quantized_modules(folder) -> dict[str, tuple[int, int]]:
    """module -> [N, K] of every projection the bf16 checkpoint has."""
    bf16, _ = mc.load(folder / "bf16")
    return {
        n.removesuffix(".weight"): tuple(t.shape) for n, t in bf16.items() if mc.is_quantized(n)
    }


@pytest.mark.parametrize("kind", MADE)
def test_folders_and_record(out, kind):
    folder = out / kind
    record = json.loads((folder / "make.json").read_text())
    expect = ["bf16", "ct-nvfp4", "ct-fp8"] + (["modelopt-nvfp4", "modelopt-fp8"] * HAS_MODELOPT)
    assert list(record["formats"]) == expect
    for name, entry in record["formats"].items():
        assert entry["bytes"] == mc.disk_size(folder / name) > 0
    assert not (folder / "reference-ct").exists(), "no references for the speed models"
    config = json.loads((folder / "bf16" / "config.json").read_text())
    assert config["hidden_size"] == HIDDEN and config["num_hidden_layers"] == LAYERS
    assert config["vocab_size"] == 512 and not config["tie_word_embeddings"]
    assert config["max_position_embeddings"] >= 8192 + 1024
    assert record["architecture"] == config["architectures"][0]
    assert (folder / "bf16" / "tokenizer.json").read_text() == (
        out / "tokenizer" / "tokenizer.json"
    ).read_text(), "the speed models share the trained models' tokenizer"
    if kind == "moe-large":
        # transformers 5 writes num_experts as num_local_experts
        assert config["num_local_experts"] == EXPERTS and config["num_experts_per_tok"] == 2
        assert config["norm_topk_prob"] and config["mlp_only_layers"] == []
        assert len(quantized_modules(folder)) == LAYERS * (4 + 3 * EXPERTS)
    else:
        assert config["rope_parameters"]["rope_theta"] == 500000.0
        assert config["rms_norm_eps"] == 1e-5
        assert len(quantized_modules(folder)) == LAYERS * 7


def test_full_size_shapes():
    dense = mc.large_config("dense-large", 8192, tiny=False)
    assert (dense.hidden_size, dense.intermediate_size, dense.num_hidden_layers) == (4096, 14336, 8)
    assert (dense.num_attention_heads, dense.num_key_value_heads, dense.head_dim) == (32, 8, 128)
    deep = mc.large_config("dense-8b", 8192, tiny=False)  # Llama-3.1-8B's layers, all of them
    assert deep.to_dict() == {**dense.to_dict(), "num_hidden_layers": 32}
    moe = mc.large_config("moe-large", 8192, tiny=False)
    assert (moe.hidden_size, moe.num_experts, moe.num_experts_per_tok) == (2048, 128, 8)
    assert (moe.moe_intermediate_size, moe.num_hidden_layers, moe.head_dim) == (768, 4, 128)
    assert (moe.num_attention_heads, moe.num_key_value_heads) == (32, 4)


def test_random_weights_give_per_projection_scales(out):
    """Each projection's (and each expert's w1 / w3) NVFP4 global scale is its own."""
    ct, _ = mc.load(out / "dense-large" / "ct-nvfp4")
    attn = {p: ct[f"model.layers.0.self_attn.{p}_proj.weight_global_scale"].item() for p in "qkv"}
    assert len(set(attn.values())) == 3
    moe, _ = mc.load(out / "moe-large" / "ct-nvfp4")
    for e in range(EXPERTS):
        w1, w3 = (moe[f"{EXPERTS_PREFIX}.{e}.{p}_proj.weight_global_scale"] for p in ("gate", "up"))
        assert w1.item() != w3.item(), f"expert {e}: w1 and w3 have the same global scale"


@pytest.mark.parametrize("kind", MADE)
def test_ct_fp8_tensors(out, kind):
    from compressed_tensors.quantization import QuantizationConfig, preset_name_to_scheme

    folder = out / kind
    fp8, config = mc.load(folder / "ct-fp8")
    bf16, _ = mc.load(folder / "bf16")
    qc = config["quantization_config"]
    assert qc["format"] == "float-quantized" and qc["quant_method"] == "compressed-tensors"
    scheme = QuantizationConfig.model_validate(qc).config_groups["group_0"]
    assert scheme == preset_name_to_scheme("FP8_DYNAMIC", ["Linear"])
    routers = sorted(n.removesuffix(".weight") for n in bf16 if n.endswith("mlp.gate.weight"))
    assert qc["ignore"] == ["lm_head", *routers]
    assert len(routers) == (LAYERS if kind == "moe-large" else 0)
    modules = quantized_modules(folder)
    for module, (n, k) in modules.items():
        w, s = fp8.pop(f"{module}.weight"), fp8.pop(f"{module}.weight_scale")
        assert (w.dtype, tuple(w.shape)) == (torch.float8_e4m3fn, (n, k)), module
        assert (s.dtype, tuple(s.shape)) == (torch.float32, (n, 1)), module
        ref = bf16.pop(f"{module}.weight").float()
        err = (w.float() * s - ref).norm() / ref.norm()
        assert err < 0.05, f"{module}: FP8 relative error {err:.3f}"
    assert set(fp8) == set(bf16), "only the projections change"
    assert all(torch.equal(fp8[n], bf16[n]) for n in fp8)


@needs_modelopt
@pytest.mark.parametrize("kind", MADE)
def test_modelopt_fp8_tensors(out, kind):
    folder = out / kind
    hf = json.loads((folder / "modelopt-fp8" / "hf_quant_config.json").read_text())
    assert hf["quantization"]["quant_algo"] == "FP8"
    assert "lm_head" in hf["quantization"]["exclude_modules"]
    mo, _ = mc.load(folder / "modelopt-fp8")
    for module, (n, k) in quantized_modules(folder).items():
        w = mo[f"{module}.weight"]
        assert (w.dtype, tuple(w.shape)) == (torch.float8_e4m3fn, (n, k)), module
        for leaf in ("weight_scale", "input_scale"):
            t = mo[f"{module}.{leaf}"]
            assert t.dtype == torch.float32 and t.numel() == 1 and t.item() > 0, (module, leaf)


# ---- SGLang's side ----------------------------------------------------------------------------


@pytest.fixture
def sm90(monkeypatch):
    """The pin's modules, imported first, then torch reporting an SM90 GPU to the capability
    checks (what the CPU machine cannot answer). Nothing else is patched, so nothing that the
    pin caches at import or in its probes sees a GPU that is not there."""
    pytest.importorskip("sglang", reason="the (patched) pin is not installed")
    from sglang.srt.configs import model_config
    from sglang.srt.layers import linear, moe
    from sglang.srt.layers.moe import fused_moe_triton
    from sglang.srt.layers.quantization import modelopt_quant, unquant
    from sglang.srt.layers.quantization.compressed_tensors import compressed_tensors
    from sglang.srt.model_loader import weight_utils

    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    yield types.SimpleNamespace(
        ModelConfig=model_config.ModelConfig,
        ReplicatedLinear=linear.ReplicatedLinear,
        MoeRunnerConfig=moe.MoeRunnerConfig,
        FusedMoE=fused_moe_triton.FusedMoE,
        ModelOptFp8Config=modelopt_quant.ModelOptFp8Config,
        CompressedTensorsConfig=compressed_tensors.CompressedTensorsConfig,
        UnquantizedLinearMethod=unquant.UnquantizedLinearMethod,
        get_quant_config=weight_utils.get_quant_config,
    )
    monkeypatch.undo()
    for name, module in list(sys.modules.items()):  # probes cached while the GPU was mocked
        if name.startswith("sglang") and module is not None:
            for value in list(vars(module).values()):
                if isinstance(value, functools._lru_cache_wrapper):
                    value.cache_clear()


def loader_quant_config(sg, folder, quantization: str, hf_quant_config_json: bool = False):
    """The quant config as the model loader builds it (weight_utils.get_quant_config): from
    config.json's quantization_config, or (``hf_quant_config_json``) from that file."""
    hf = json.loads((folder / "config.json").read_text())
    model_config = types.SimpleNamespace(
        quantization=quantization,
        hf_config=types.SimpleNamespace(
            architectures=hf["architectures"],
            quantization_config=None if hf_quant_config_json else hf["quantization_config"],
        ),
        model_path=str(folder),
        revision=None,
    )
    load_config = types.SimpleNamespace(download_dir=None, model_loader_extra_config={})
    return sg.get_quant_config(model_config, load_config, packed_modules_mapping={})


def linear(sg, quant_config, prefix: str, n: int, k: int):
    return sg.ReplicatedLinear(
        k, n, bias=False, params_dtype=torch.bfloat16, quant_config=quant_config, prefix=prefix
    )


def moe_layer(sg):
    """A FusedMoE without its parallel-group set-up (CPU has none): the attributes FusedMoE
    sets before it asks the quant config for a method."""
    layer = sg.FusedMoE.__new__(sg.FusedMoE)
    torch.nn.Module.__init__(layer)
    sizes = dict(num_experts=EXPERTS, num_local_experts=EXPERTS, hidden_size=HIDDEN,
                 intermediate_size_per_partition=MOE_INTER, top_k=2)  # fmt: skip
    for key, value in sizes.items():
        setattr(layer, key, value)
    layer.moe_ep_rank, layer.moe_ep_size, layer.moe_tp_size = 0, 1, 1
    layer.use_flashinfer_trtllm_moe = False
    layer.params_dtype = torch.bfloat16
    layer.moe_runner_config = sg.MoeRunnerConfig(
        **sizes, layer_id=0, params_dtype=torch.bfloat16, activation="silu", is_gated=True
    )
    return layer


def create_moe_weights(layer, method) -> dict[str, torch.Tensor]:
    method.create_weights(
        layer,
        num_experts=EXPERTS,
        hidden_size=HIDDEN,
        intermediate_size_per_partition=MOE_INTER,
        params_dtype=torch.bfloat16,
        weight_loader=lambda *args, **kwargs: None,
        intermediate_size_full=MOE_INTER,
    )
    return dict(layer.named_parameters())


def test_sglang_serves_ct_fp8_with_its_fp8_schemes(out, sm90):
    dense, _ = mc.load(out / "dense-large" / "ct-fp8")
    qc = loader_quant_config(sm90, out / "dense-large" / "ct-fp8", "compressed-tensors")
    assert isinstance(qc, sm90.CompressedTensorsConfig) and qc.quant_format == "float-quantized"
    n, k = dense[f"{O_PROJ}.weight"].shape
    layer = linear(sm90, qc, O_PROJ, n, k)
    assert type(layer.scheme).__name__ == "CompressedTensorsW8A8Fp8"
    assert not layer.scheme.is_static_input_scheme, "FP8_DYNAMIC: per-token activation scales"
    params = dict(layer.named_parameters())
    assert set(params) == {"weight", "weight_scale"}
    for leaf, p in params.items():
        t = dense[f"{O_PROJ}.{leaf}"]
        assert (p.dtype, p.shape) == (t.dtype, t.shape), leaf
    head = linear(sm90, qc, "lm_head", 512, HIDDEN)
    assert isinstance(head.quant_method, sm90.UnquantizedLinearMethod)

    moe, _ = mc.load(out / "moe-large" / "ct-fp8")
    qc = loader_quant_config(sm90, out / "moe-large" / "ct-fp8", "compressed-tensors")
    layer = moe_layer(sm90)
    method = qc.get_quant_method(layer, prefix=EXPERTS_PREFIX)
    assert type(layer.scheme).__name__ == "CompressedTensorsW8A8Fp8MoE"
    params = create_moe_weights(layer, method)

    def fused(leaf: str, projections: tuple[str, ...]) -> torch.Tensor:
        """The checkpoint's per-expert tensors, as FusedMoE stacks them (w1 rows, then w3)."""
        return torch.stack([
            torch.cat([moe[f"{EXPERTS_PREFIX}.{e}.{p}_proj.{leaf}"] for p in projections])
            for e in range(EXPERTS)
        ])  # fmt: skip

    expect = {
        "w13_weight": fused("weight", ("gate", "up")),
        "w2_weight": fused("weight", ("down",)),
        "w13_weight_scale": fused("weight_scale", ("gate", "up")),
        "w2_weight_scale": fused("weight_scale", ("down",)),
    }
    assert set(params) == set(expect), "dynamic activations: no input scales"
    for name, t in expect.items():
        assert (params[name].dtype, params[name].shape) == (t.dtype, t.shape), name
    router = linear(sm90, qc, "model.layers.0.mlp.gate", EXPERTS, HIDDEN)
    assert isinstance(router.quant_method, sm90.UnquantizedLinearMethod)


@needs_modelopt
def test_sglang_serves_modelopt_fp8_with_its_fp8_methods(out, sm90):
    for kind in mc.LARGE:
        folder = out / kind / "modelopt-fp8"
        hf_config = json.loads((folder / "config.json").read_text())
        qc = hf_config["quantization_config"]
        # what ModelConfig makes of config.json's quantization_config (quant_method "modelopt")
        me = types.SimpleNamespace(hf_config=types.SimpleNamespace(**hf_config))
        parsed = sm90.ModelConfig._parse_modelopt_quant_config(me, {"quantization": qc})
        assert parsed["quant_method"] == "modelopt_fp8"
        flat = loader_quant_config(sm90, folder, parsed["quant_method"])
        assert isinstance(flat, sm90.ModelOptFp8Config)
        nested = loader_quant_config(
            sm90, folder, parsed["quant_method"], hf_quant_config_json=True
        )
        assert isinstance(nested, sm90.ModelOptFp8Config)
        assert flat.is_checkpoint_fp8_serialized and nested.is_checkpoint_fp8_serialized
        assert flat.kv_cache_quant_algo is None and "lm_head" in nested.exclude_modules
        tensors, _ = mc.load(folder)
        n, k = tensors[f"{O_PROJ}.weight"].shape
        layer = linear(sm90, flat, O_PROJ, n, k)
        assert type(layer.quant_method).__name__ == "ModelOptFp8LinearMethod"
        params = dict(layer.named_parameters())
        assert set(params) == {"weight", "weight_scale", "input_scale"}
        for leaf, p in params.items():
            t = tensors[f"{O_PROJ}.{leaf}"]
            assert p.dtype == t.dtype and p.numel() == t.numel(), leaf  # scalars -> [1]
        for config in (flat, nested):
            assert isinstance(linear(sm90, config, "lm_head", 512, HIDDEN).quant_method,
                              sm90.UnquantizedLinearMethod)  # fmt: skip
        if kind != "moe-large":
            continue
        for config in (flat, nested):
            router = linear(sm90, config, "model.layers.0.mlp.gate", EXPERTS, HIDDEN)
            assert isinstance(router.quant_method, sm90.UnquantizedLinearMethod)
        layer = moe_layer(sm90)
        method = flat.get_quant_method(layer, prefix=EXPERTS_PREFIX)
        assert type(method).__name__ == "ModelOptFp8MoEMethod"
        params = create_moe_weights(layer, method)
        e0 = f"{EXPERTS_PREFIX}.0"
        assert params["w13_weight"].dtype == tensors[f"{e0}.gate_proj.weight"].dtype
        assert params["w13_weight"].shape == (EXPERTS, 2 * MOE_INTER, HIDDEN)
        assert params["w2_weight"].shape == (EXPERTS, HIDDEN, MOE_INTER)
        assert params["w13_weight_scale"].shape == (EXPERTS, 2)  # per expert: w1, w3
        assert params["w13_input_scale"].shape == (EXPERTS,)
        for e in range(EXPERTS):
            for p in ("gate", "up", "down"):
                for leaf in ("weight_scale", "input_scale"):
                    assert tensors[f"{EXPERTS_PREFIX}.{e}.{p}_proj.{leaf}"].numel() == 1
