"""Make small, trained, deterministic models and their NVFP4 checkpoints for serving tests.

For each trained model (``dense``: Llama, no bias; ``dense-bias``: Qwen2, qkv bias; ``moe``:
Qwen3-MoE, 8 experts, top-2) this trains briefly on Python's own standard-library sources (a
byte-level BPE tokenizer trained on the same text; every 20th file held out for perplexity), then
writes:

  OUT/MODEL/bf16/                the trained model, unquantized (bf16)
  OUT/MODEL/ct-nvfp4/            compressed-tensors nvfp4-pack-quantized (W4A4 NVFP4 scheme),
                                 packed by compressed-tensors' own NVFP4PackedCompressor
  OUT/MODEL/modelopt-nvfp4/      ModelOpt NVFP4 by nvidia-modelopt (mtq.quantize with
                                 NVFP4_DEFAULT_CFG + export_hf_checkpoint: hf_quant_config.json)
  OUT/MODEL/reference-ct/        ct-nvfp4 with every NVFP4 weight replaced by its exact
  OUT/MODEL/reference-modelopt/  dequantization (bf16), checked against the producer's reader
  OUT/heldout.txt, OUT/MODEL/train.json   the held-out text and the training record

The speed models (``--models dense-large,moe-large``; not in the default list) are not trained:
``dense-large`` is a Llama of Llama-3.1-8B width (hidden 4096, intermediate 14336, 32 / 8 heads,
8 layers), ``moe-large`` a Qwen3-MoE of Qwen3-30B-A3B's expert shape (hidden 2048, 128 experts
top-8, expert 768, 4 layers), ``dense-8b`` (asked for alone: 34 GiB on disk) Llama-3.1-8B's
width and all 32 of its layers, so that a decode step is mostly the weights' read. Their weights
are random (normal, std 0.02, each projection and each expert's gate / up / down scaled by its
own seeded factor in [0.5, 2], so that per-tensor scales differ as a real observer's would),
drawn on CUDA when present (so a CUDA host and a CPU host write different numbers). They share
the trained models' tokenizer. Per model:

  OUT/MODEL/bf16/, ct-nvfp4/, modelopt-nvfp4/   as above (same producers, same code)
  OUT/MODEL/ct-fp8/              compressed-tensors float-quantized, FP8_DYNAMIC scheme (W8A8:
                                 FP8 E4M3 weights per output channel, dynamic per-token
                                 activations), by compressed-tensors' own observer arithmetic
                                 (calculate_qparams) and FloatQuantizationCompressor
  OUT/MODEL/modelopt-fp8/        ModelOpt FP8 by nvidia-modelopt (FP8_DEFAULT_CFG: per-tensor
                                 weight and static input scales) + export_hf_checkpoint
  OUT/MODEL/make.json            parameters, formats written, their sizes on disk, seconds

No references are written for them and the per-weight reader check is skipped: accuracy is
measured on the trained models; these exist to time decode and prefill. Calibration (ModelOpt's
forward loop, ct-nvfp4's input_global_scale) uses a few seeded random-token windows.
``--tiny`` makes every model at hidden 256, 2 layers (the MoE ones with 8 experts, top-2).

Seeds are fixed, so a rerun on the same Python, device and package versions gives the same files.
The script runs on CUDA when available, else CPU (``--tiny`` for a quick check).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import sys
import sysconfig
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from nvfp4 import (  # noqa: E402
    activation_global_scale,
    dequantized_state,
    nvfp4_scales,
    stored_weights,
)

ROOT = Path(__file__).resolve().parent.parent
MODELS = ("dense", "dense-bias", "moe")  # trained; the default --models
LARGE = ("dense-large", "moe-large", "dense-8b")  # random weights, for timing (with FP8 twins)
QUANTIZED = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


# ---- corpus and tokenizer -------------------------------------------------------------------


def corpus(limit_bytes: int) -> tuple[str, str]:
    """(train, held-out) text: the stdlib's .py sources (no tests) in path order, every 20th
    file held out, up to ``limit_bytes`` characters."""
    lib = Path(sysconfig.get_paths()["stdlib"])
    skip = {"site-packages", "test", "tests", "idle_test", "__pycache__"}
    files = sorted(
        p for p in lib.rglob("*.py") if p.is_file() and not skip & set(p.relative_to(lib).parts)
    )
    train, held, size = [], [], 0
    for i, path in enumerate(files):
        text = path.read_text(encoding="utf-8", errors="replace")
        (held if i % 20 == 19 else train).append(text)
        size += len(text)
        if size >= limit_bytes:
            break
    return "\n".join(train), "\n".join(held)


def train_tokenizer(text: str, vocab: int, out: Path):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    chunks = [text[i : i + 4096] for i in range(0, len(text), 4096)]
    tok.train_from_iterator(chunks, trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<|endoftext|>", eos_token="<|endoftext|>"
    )
    fast.save_pretrained(out)
    return fast


# ---- models ---------------------------------------------------------------------------------


def make_config(kind: str, vocab: int, tiny: bool):
    from transformers import LlamaConfig, Qwen2Config, Qwen3MoeConfig

    hidden, layers, heads, kv = (256, 2, 4, 2) if tiny else (1024, 4, 16, 4)
    inter = 512 if tiny else 2816
    common = dict(
        vocab_size=vocab,
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv,
        max_position_embeddings=2048,
        rms_norm_eps=1e-6,
        tie_word_embeddings=False,
        bos_token_id=0,
        eos_token_id=0,
    )
    if kind == "dense":
        return LlamaConfig(intermediate_size=inter, attention_bias=False, mlp_bias=False, **common)
    if kind == "dense-bias":
        return Qwen2Config(intermediate_size=inter, **common)  # Qwen2: qkv bias, no o/mlp bias
    return Qwen3MoeConfig(
        intermediate_size=inter,
        moe_intermediate_size=128 if tiny else 768,
        num_experts=8,
        num_experts_per_tok=2,
        decoder_sparse_step=1,
        mlp_only_layers=[],
        norm_topk_prob=True,
        head_dim=hidden // heads,
        **common,
    )


def large_config(kind: str, vocab: int, tiny: bool):
    """The speed models' shapes (random weights); ``tiny``: hidden 256, 2 layers, 8 experts."""
    from transformers import LlamaConfig, Qwen3MoeConfig

    common = dict(
        vocab_size=vocab,
        max_position_embeddings=16384,  # room for an 8192-token prefill plus decode
        tie_word_embeddings=False,
        bos_token_id=0,
        eos_token_id=0,
    )
    if kind in ("dense-large", "dense-8b"):  # Llama-3.1-8B width; 8 layers, or its 32
        shape = dict(hidden_size=256, intermediate_size=896, num_hidden_layers=2,
                     num_attention_heads=4, num_key_value_heads=2) if tiny else dict(
                     hidden_size=4096, intermediate_size=14336,
                     num_hidden_layers=8 if kind == "dense-large" else 32,
                     num_attention_heads=32, num_key_value_heads=8)  # fmt: skip
        return LlamaConfig(
            **shape, **common, attention_bias=False, mlp_bias=False, rms_norm_eps=1e-5,
            rope_theta=500000.0, architectures=["LlamaForCausalLM"],
        )  # fmt: skip
    if kind == "moe-large":  # Qwen3-30B-A3B's experts and attention, 4 layers
        shape = dict(hidden_size=256, num_hidden_layers=2, num_attention_heads=4,
                     num_key_value_heads=2, head_dim=64, num_experts=8, num_experts_per_tok=2,
                     moe_intermediate_size=128) if tiny else dict(
                     hidden_size=2048, num_hidden_layers=4, num_attention_heads=32,
                     num_key_value_heads=4, head_dim=128, num_experts=128,
                     num_experts_per_tok=8, moe_intermediate_size=768)  # fmt: skip
        return Qwen3MoeConfig(
            **shape, **common, intermediate_size=6144, decoder_sparse_step=1, mlp_only_layers=[],
            norm_topk_prob=True, rms_norm_eps=1e-6, rope_theta=1000000.0,
            architectures=["Qwen3MoeForCausalLM"],
        )  # fmt: skip
    raise ValueError(f"unknown large model {kind!r}; choose from {LARGE}")


def seed_of(kind: str) -> int:
    return sum(kind.encode()) * 7919  # fixed per model name


@torch.no_grad()
def random_model(config, device: str, seed: int):
    """A bf16 model with seeded random weights, drawn on ``device``.

    Matrices ~ N(0, 0.02) (HF's init), then each quantized projection (and, for fused experts,
    each expert's gate, up and down) is multiplied by its own factor 2**u, u ~ U(-1, 1), drawn
    on the CPU: per-tensor maxima, hence NVFP4 / FP8 per-tensor scales, differ between q/k/v,
    gate/up and w1/w3 as they do in a calibrated real model. Norms are 1.
    """
    from transformers import AutoModelForCausalLM

    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    gen = torch.Generator(device=device).manual_seed(seed)
    factors = torch.Generator().manual_seed(seed + 1)

    def factor(*shape) -> torch.Tensor:
        return torch.exp2(torch.rand(shape, generator=factors) * 2 - 1).to(device, torch.bfloat16)

    for name, p in model.named_parameters():
        if p.dim() == 1:
            p.fill_(1.0)
            continue
        p.normal_(0.0, 0.02, generator=gen)
        if name.endswith("mlp.experts.gate_up_proj"):  # [E, 2I, H]: gate rows, then up rows
            e, two_i, h = p.shape
            p.view(e, 2, two_i // 2, h).mul_(factor(e, 2, 1, 1))
        elif name.endswith("mlp.experts.down_proj"):  # [E, H, I]
            p.mul_(factor(p.shape[0], 1, 1))
        elif is_quantized(name):
            p.mul_(factor())
    model.eval()
    return model


def train(model, ids: torch.Tensor, steps: int, seq: int, batch: int, device: str) -> list[float]:
    gen = torch.Generator().manual_seed(1234)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01, betas=(0.9, 0.95))
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / 20) * 0.5 * (1 + math.cos(math.pi * s / steps))
    )
    losses = []
    model.train()
    for step in range(steps):
        starts = torch.randint(0, ids.numel() - seq - 1, (batch,), generator=gen)
        x = torch.stack([ids[s : s + seq] for s in starts]).to(device)
        with torch.autocast(device_type=device, dtype=torch.bfloat16, enabled=device == "cuda"):
            loss = model(input_ids=x, labels=x).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
        if step % max(1, steps // 10) == 0 or step == steps - 1:
            log(f"  step {step + 1}/{steps} loss {loss.item():.3f}")
    model.eval()
    return losses


@torch.no_grad()
def perplexity(model, ids: torch.Tensor, seq: int, device: str, max_windows: int = 64) -> float:
    windows = min(max_windows, (ids.numel() - 1) // seq)
    if windows == 0:
        raise SystemExit(
            f"held-out text has {ids.numel()} tokens, under {seq + 1}: raise --corpus-kb"
        )
    nll, count = 0.0, 0
    for w in range(windows):
        x = ids[w * seq : (w + 1) * seq].unsqueeze(0).to(device)
        loss = model(input_ids=x, labels=x).loss
        nll += loss.item() * (seq - 1)
        count += seq - 1
    return math.exp(nll / count)


@torch.no_grad()
def activation_amax(model, ids: torch.Tensor, seq: int, device: str) -> dict[str, float]:
    """Largest |input| seen by each quantized projection over a few calibration windows."""
    amax: dict[str, float] = {}
    hooks = []

    def hook(name):
        def fn(_mod, args):
            amax[name] = max(amax.get(name, 0.0), args[0].abs().max().item())

        return fn

    for name, mod in model.named_modules():
        linear = isinstance(mod, torch.nn.Linear) and name.rsplit(".", 1)[-1] in QUANTIZED
        if linear or type(mod).__name__.endswith("Experts"):  # fused experts: their input
            hooks.append(mod.register_forward_pre_hook(hook(name)))
    for w in range(8):
        model(input_ids=ids[w * seq : (w + 1) * seq].unsqueeze(0).to(device))
    for h in hooks:
        h.remove()
    return amax


# ---- checkpoint tensors ---------------------------------------------------------------------


def canonical_state(model) -> dict[str, torch.Tensor]:
    """HF checkpoint names, with fused MoE experts split into per-expert projections."""
    out = {}
    for name, t in model.state_dict().items():
        t = t.detach().cpu()
        if name.endswith("mlp.experts.gate_up_proj"):
            base = name.removesuffix("gate_up_proj")
            for e in range(t.shape[0]):
                gate, up = t[e].chunk(2, dim=0)
                out[f"{base}{e}.gate_proj.weight"] = gate.contiguous()
                out[f"{base}{e}.up_proj.weight"] = up.contiguous()
        elif name.endswith("mlp.experts.down_proj"):
            base = name.removesuffix("down_proj")
            for e in range(t.shape[0]):
                out[f"{base}{e}.down_proj.weight"] = t[e].contiguous()
        else:
            out[name] = t
    return out


def is_quantized(name: str) -> bool:
    parts = name.split(".")
    return parts[-1] == "weight" and len(parts) >= 2 and parts[-2] in QUANTIZED


def input_amax_for(name: str, amax: dict[str, float]) -> float:
    """Calibrated input maximum of a projection; experts share their block's input maximum.

    Only compressed-tensors' ``input_global_scale`` uses it, which weight-only serving ignores.
    """
    module = name.removesuffix(".weight")
    if module in amax:
        return amax[module]
    experts = module.rsplit(".", 2)[0]  # ...mlp.experts.E.proj -> ...mlp.experts
    return amax.get(experts, 1.0)


def save(folder: Path, tensors: dict[str, torch.Tensor], config: dict, tokenizer_dir: Path):
    """Write one checkpoint folder atomically (a .partial folder renamed into place)."""
    from safetensors.torch import save_file

    tmp = folder.with_name(folder.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    tensors = {k: v.contiguous() for k, v in sorted(tensors.items())}
    save_file(tensors, tmp / "model.safetensors", metadata={"format": "pt"})
    (tmp / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    for f in tokenizer_dir.iterdir():
        shutil.copy2(f, tmp / f.name)
    replace_dir(tmp, folder)


def replace_dir(src: Path, dst: Path) -> None:
    shutil.rmtree(dst, ignore_errors=True)
    os.replace(src, dst)


def load(folder: Path) -> tuple[dict[str, torch.Tensor], dict]:
    from safetensors.torch import load_file

    tensors: dict[str, torch.Tensor] = {}
    for f in sorted(folder.glob("*.safetensors")):
        tensors.update(load_file(f))
    return tensors, json.loads((folder / "config.json").read_text())


def export_compressed_tensors(
    bf16: dict, config: dict, amax, dst: Path, tok_dir: Path, device: str = "cpu"
) -> int:
    """compressed-tensors NVFP4 (W4A4 scheme, nvfp4-pack-quantized), packed by its compressor.

    The scales follow the producers' observer (serve/nvfp4.nvfp4_scales); the E2M1 rounding and
    packing are compressed-tensors' own (NVFP4PackedCompressor.compress), run on ``device``
    (compressed-tensors picks its Triton kernels for CUDA tensors).
    """
    from compressed_tensors.compressors.nvfp4.base import NVFP4PackedCompressor
    from compressed_tensors.quantization import QuantizationConfig, preset_name_to_scheme

    scheme = preset_name_to_scheme("NVFP4", ["Linear"])
    out, count = {}, 0
    for name, t in bf16.items():
        if not is_quantized(name):
            out[name] = t
            continue
        t = t.to(device)
        block_scale, global_scale = nvfp4_scales(t)
        module = name.removesuffix(".weight")
        packed = NVFP4PackedCompressor.compress(
            {"weight": t.float(), "weight_scale": block_scale.float(),
             "weight_global_scale": global_scale},
            scheme,
        )  # fmt: skip
        out[f"{module}.weight_packed"] = packed["weight_packed"].cpu()
        out[f"{module}.weight_scale"] = packed["weight_scale"].cpu()
        out[f"{module}.weight_global_scale"] = global_scale.cpu()
        out[f"{module}.input_global_scale"] = activation_global_scale(input_amax_for(name, amax))
        count += 1
    qc = QuantizationConfig(
        config_groups={"group_0": scheme},
        format="nvfp4-pack-quantized",
        quantization_status="compressed",
        ignore=ct_ignore(bf16),
    )
    config = {**config, "quantization_config": json.loads(qc.model_dump_json())}
    save(dst, out, config, tok_dir)
    return count


def ct_ignore(bf16: dict) -> list[str]:
    """Modules compressed-tensors leaves unquantized: the LM head and the MoE routers."""
    return [
        "lm_head",
        *sorted(n.removesuffix(".weight") for n in bf16 if n.endswith("mlp.gate.weight")),
    ]


def export_compressed_tensors_fp8(
    bf16: dict, config: dict, dst: Path, tok_dir: Path, device: str = "cpu"
) -> int:
    """compressed-tensors FP8 W8A8 (float-quantized, the FP8_DYNAMIC preset scheme).

    Weights: FP8 E4M3 with one float32 scale per output channel ([N, 1]) from compressed-tensors'
    own observer arithmetic (calculate_qparams over each row's min / max), cast by its
    FloatQuantizationCompressor; activations are quantized per token at run time (no scales
    stored). The LM head and MoE routers stay bf16.
    """
    from compressed_tensors.compressors.naive_quantized.base import FloatQuantizationCompressor
    from compressed_tensors.quantization import QuantizationConfig, preset_name_to_scheme
    from compressed_tensors.quantization.utils import calculate_qparams

    scheme = preset_name_to_scheme("FP8_DYNAMIC", ["Linear"])
    out, count = {}, 0
    for name, t in bf16.items():
        if not is_quantized(name):
            out[name] = t
            continue
        w = t.to(device).float()
        scale, _ = calculate_qparams(
            w.amin(dim=1, keepdim=True), w.amax(dim=1, keepdim=True), scheme.weights
        )
        module = name.removesuffix(".weight")
        packed = FloatQuantizationCompressor.compress({"weight": w, "weight_scale": scale}, scheme)
        out[f"{module}.weight"] = packed["weight"].cpu()
        out[f"{module}.weight_scale"] = scale.to(torch.float32).cpu()
        count += 1
    qc = QuantizationConfig(
        config_groups={"group_0": scheme},
        format="float-quantized",
        quantization_status="compressed",
        ignore=ct_ignore(bf16),
    )
    config = {**config, "quantization_config": json.loads(qc.model_dump_json())}
    save(dst, out, config, tok_dir)
    return count


def export_modelopt(
    src: Path, dst: Path, calib: list[torch.Tensor], tok_dir: Path, algo: str = "NVFP4"
) -> bool:
    """ModelOpt ``algo`` (NVFP4 or FP8) by nvidia-modelopt itself: mtq.quantize with
    NVFP4_DEFAULT_CFG / FP8_DEFAULT_CFG over ``calib``, then export_hf_checkpoint."""
    try:
        import modelopt.torch.quantization as mtq
        from modelopt.torch.export import export_hf_checkpoint
    except ImportError:
        log("  modelopt: nvidia-modelopt is not installed; skipped (serve/make-checkpoints.sh "
            "installs requirements/checkpoints.txt into .work/ckpt-venv)")  # fmt: skip
        return False
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(src, dtype=torch.bfloat16).to(calib[0].device)

    def forward_loop(m):
        for x in calib:
            m(input_ids=x.unsqueeze(0))

    model = mtq.quantize(model, getattr(mtq, f"{algo}_DEFAULT_CFG"), forward_loop)
    tmp = dst.with_name(dst.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    export_hf_checkpoint(model, export_dir=str(tmp))
    for f in tok_dir.iterdir():
        shutil.copy2(f, tmp / f.name)
    replace_dir(tmp, dst)
    del model
    free_device_memory(calib[0].device.type)
    return True


def write_reference(src: Path, fmt: str, dst: Path, tok_dir: Path) -> int:
    """The unquantized model whose weights are the exact dequantization of ``src``'s."""
    tensors, config = load(src)
    count = len(stored_weights(tensors, fmt))
    config = {k: v for k, v in config.items() if k != "quantization_config"}
    save(dst, dequantized_state(tensors, fmt, torch.bfloat16), config, tok_dir)
    return count


def check_reference(src: Path, fmt: str, ref: Path) -> None:
    """The reference must equal, bit for bit in bf16, the producer's own reader of ``src``.

    (compressed-tensors' reader computes in bf16; the reference is the exact float32 value
    rounded once to bf16; the two agree on every element.)
    """
    tensors, _ = load(src)
    ref_tensors, _ = load(ref)
    theirs = PRODUCER_READERS[fmt](tensors)
    bad = [
        m
        for m, w in theirs.items()
        if not torch.equal(ref_tensors[f"{m}.weight"], w.to(torch.bfloat16))
    ]
    if bad:
        raise SystemExit(f"{ref}: {len(bad)} weights differ from {fmt}'s own reader, e.g. {bad[0]}")
    log(f"  {ref.parent.name}/{ref.name}: equals {fmt}'s own reader on all {len(theirs)} weights")


def read_with_compressed_tensors(tensors) -> dict[str, torch.Tensor]:
    from compressed_tensors.compressors.nvfp4.base import NVFP4PackedCompressor
    from compressed_tensors.quantization import preset_name_to_scheme

    scheme = preset_name_to_scheme("NVFP4", ["Linear"])
    out = {}
    for module, w in stored_weights(tensors, "compressed-tensors").items():
        sd = {"weight_packed": w.packed, "weight_scale": w.block_scale,
              "weight_global_scale": w.global_scale}  # fmt: skip
        out[module] = NVFP4PackedCompressor.decompress(sd, scheme)["weight"]
    return out


def read_with_modelopt(tensors) -> dict[str, torch.Tensor]:
    from modelopt.torch.quantization.qtensor import NVFP4QTensor

    out = {}
    for module, w in stored_weights(tensors, "modelopt").items():
        n, half = w.packed.shape
        q = NVFP4QTensor(torch.Size((n, half * 2)), torch.float32, w.packed)
        out[module] = q.dequantize(
            dtype=torch.float32, scale=w.block_scale, double_scale=w.global_scale,
            block_sizes={-1: 16},
        )  # fmt: skip
    return out


PRODUCER_READERS = {
    "compressed-tensors": read_with_compressed_tensors,
    "modelopt": read_with_modelopt,
}


def disk_size(folder: Path) -> int:
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())


def mib(n: int) -> str:
    return f"{n / 2**20:.1f} MiB"


def free_device_memory(device: str) -> None:
    if device == "cuda":
        torch.cuda.empty_cache()


def make_large(kind: str, out: Path, tokenizer, tok_dir: Path, tiny: bool, device: str) -> dict:
    """One speed model: random bf16 weights, then ct-nvfp4, modelopt-nvfp4, ct-fp8, modelopt-fp8.

    No references and no per-weight reader check (accuracy is the trained models' job); the
    formats come from the same export functions as the trained models' NVFP4.
    """
    t0 = time.time()
    folder = out / kind
    config = large_config(kind, len(tokenizer), tiny)
    model = random_model(config, device, seed_of(kind))
    n = sum(p.numel() for p in model.parameters())
    log(f"{kind}: {config.model_type}, {n / 1e6:.1f} M parameters, random weights on {device}")
    seq = 128 if tiny else 512
    gen = torch.Generator().manual_seed(seed_of(kind) + 2)
    calib_ids = torch.randint(0, len(tokenizer), (8 * seq,), generator=gen)
    calib = [calib_ids[w * seq : (w + 1) * seq].to(device) for w in range(8)]
    amax = activation_amax(model, calib_ids, seq, device)
    tmp = folder / "bf16.partial"
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    replace_dir(tmp, folder / "bf16")
    del model
    free_device_memory(device)
    formats: dict[str, dict] = {}

    def done(name: str, t: float, **extra) -> None:
        size = disk_size(folder / name)
        formats[name] = {"bytes": size, "seconds": round(time.time() - t, 1), **extra}
        log(f"  {name}: {mib(size)} in {time.time() - t:.1f} s")

    done("bf16", t0)
    bf16, cfg = load(folder / "bf16")
    t = time.time()
    log(f"  ct-nvfp4: compressed-tensors NVFP4 on {device}")
    count = export_compressed_tensors(bf16, cfg, amax, folder / "ct-nvfp4", tok_dir, device)
    done("ct-nvfp4", t, quantized_weights=count)
    t = time.time()
    log(f"  ct-fp8: compressed-tensors FP8_DYNAMIC on {device}")
    count = export_compressed_tensors_fp8(bf16, cfg, folder / "ct-fp8", tok_dir, device)
    done("ct-fp8", t, quantized_weights=count)
    del bf16
    for algo in ("NVFP4", "FP8"):
        name, t = f"modelopt-{algo.lower()}", time.time()
        log(f"  {name}: mtq.quantize({algo}_DEFAULT_CFG) over {len(calib)} x {seq} random tokens")
        if export_modelopt(folder / "bf16", folder / name, calib, tok_dir, algo):
            done(name, t)
        elif (folder / name).exists():
            shutil.rmtree(folder / name)  # an earlier run's, of other weights maybe
            log(f"  {name}: removed the earlier run's folder (not remade without nvidia-modelopt)")
        free_device_memory(device)
    record = {"model": kind, "architecture": cfg["architectures"][0], "parameters": n,
              "weights": "random (seeded), not trained", "device": device, "tiny": tiny,
              "calibration": f"8 x {seq} random tokens", "formats": formats,
              "seconds": round(time.time() - t0, 1), "torch": torch.__version__,
              "python": sys.version.split()[0]}  # fmt: skip
    (folder / "make.json").write_text(json.dumps(record, indent=2) + "\n")
    log(f"{kind}: wrote {folder} ({', '.join(formats)}) in {time.time() - t0:.0f} s")
    return record


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=ROOT / ".work" / "checkpoints")
    ap.add_argument(
        "--models",
        default=",".join(MODELS),
        help=f"comma-separated, from {','.join(MODELS + LARGE)} (default: the trained three)",
    )
    ap.add_argument("--tiny", action="store_true", help="hidden 256, 2 layers: a quick check")
    ap.add_argument("--steps", type=int, default=None, help="training steps (default 600, tiny 30)")
    ap.add_argument("--vocab", type=int, default=None, help="BPE vocabulary (8192, tiny 2048)")
    ap.add_argument("--eval-windows", type=int, default=64, help="held-out windows for perplexity")
    ap.add_argument("--corpus-kb", type=int, default=None, help="corpus size (12000, tiny 2000)")
    args = ap.parse_args(argv)
    models = [m for m in args.models.split(",") if m]
    unknown = set(models) - set(MODELS) - set(LARGE)
    if unknown:
        print(
            f"error: unknown model(s) {sorted(unknown)}; choose from {MODELS + LARGE}",
            file=sys.stderr,
        )
        return 2
    device = "cuda" if torch.cuda.is_available() else "cpu"
    steps = args.steps or (30 if args.tiny else 600)
    vocab = args.vocab or (2048 if args.tiny else 8192)
    seq, batch = (128, 8) if args.tiny else (512, 16)
    torch.manual_seed(0)
    out = args.out / ("tiny" if args.tiny else "full")
    out.mkdir(parents=True, exist_ok=True)
    log(f"device {device}; output {out}")

    train_text, held_text = corpus(1000 * (args.corpus_kb or (2000 if args.tiny else 12000)))
    (out / "heldout.txt").write_text(held_text)
    log(f"corpus: {len(train_text):,} chars train, {len(held_text):,} held out (stdlib sources)")
    tok_dir = out / "tokenizer"
    tokenizer = train_tokenizer(train_text, vocab, tok_dir)
    train_ids = torch.tensor(tokenizer(train_text)["input_ids"], dtype=torch.long)
    held_ids = torch.tensor(tokenizer(held_text)["input_ids"], dtype=torch.long)
    log(f"tokenizer: vocab {len(tokenizer)}; {train_ids.numel():,} train tokens")

    from transformers import AutoModelForCausalLM

    for kind in models:
        if kind in LARGE:
            make_large(kind, out, tokenizer, tok_dir, args.tiny, device)
            continue
        torch.manual_seed(0)
        config = make_config(kind, len(tokenizer), args.tiny)
        model = AutoModelForCausalLM.from_config(config).to(device)
        n = sum(p.numel() for p in model.parameters())
        log(f"{kind}: {config.model_type}, {n / 1e6:.1f} M parameters; training {steps} steps")
        t0 = time.time()
        losses = train(model, train_ids, steps, seq, batch, device)
        ppl = perplexity(model, held_ids, seq, device, args.eval_windows)
        amax = activation_amax(model, train_ids, seq, device)
        model = model.to(torch.bfloat16)
        folder = out / kind
        tmp = folder / "bf16.partial"
        shutil.rmtree(tmp, ignore_errors=True)
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        replace_dir(tmp, folder / "bf16")
        bf16, cfg = load(folder / "bf16")
        expect = canonical_state(model)
        if set(bf16) != set(expect) or any(not torch.equal(bf16[k], expect[k]) for k in bf16):
            raise SystemExit(f"{folder / 'bf16'}: saved tensors differ from the trained model")
        n_ct = export_compressed_tensors(bf16, cfg, amax, folder / "ct-nvfp4", tok_dir)
        write_reference(folder / "ct-nvfp4", "compressed-tensors", folder / "reference-ct", tok_dir)
        check_reference(folder / "ct-nvfp4", "compressed-tensors", folder / "reference-ct")
        log(f"  ct-nvfp4: {n_ct} NVFP4 weights; reference-ct written")
        calib = [train_ids[w * seq : (w + 1) * seq].to(device) for w in range(8)]
        has_mo = export_modelopt(folder / "bf16", folder / "modelopt-nvfp4", calib, tok_dir)
        if has_mo:
            n_mo = write_reference(
                folder / "modelopt-nvfp4", "modelopt", folder / "reference-modelopt", tok_dir
            )
            check_reference(folder / "modelopt-nvfp4", "modelopt", folder / "reference-modelopt")
            log(f"  modelopt-nvfp4: {n_mo} NVFP4 weights; reference-modelopt written")
        ppls = {"bf16": perplexity(model, held_ids, seq, device, args.eval_windows)}
        for name in ("reference-ct", "reference-modelopt"):
            if (folder / name).is_dir():
                ppls[name] = perplexity(
                    AutoModelForCausalLM.from_pretrained(folder / name, dtype=torch.bfloat16).to(
                        device
                    ),
                    held_ids,
                    seq,
                    device,
                    args.eval_windows,
                )
        log(f"  held-out perplexity (transformers, bf16): {json.dumps(ppls)}")
        record = {"model": kind, "architecture": cfg["architectures"][0], "parameters": n,
                  "steps": steps, "seq": seq, "batch": batch, "device": device,
                  "final_loss": losses[-1], "heldout_ppl_fp32": ppl, "heldout_ppl": ppls,
                  "nvfp4_weights": n_ct, "modelopt": has_mo, "seconds": round(time.time() - t0, 1),
                  "torch": torch.__version__, "python": sys.version.split()[0]}  # fmt: skip
        (out / kind / "train.json").write_text(json.dumps(record, indent=2) + "\n")
        log(f"{kind}: held-out ppl {ppl:.2f} (fp32 weights); wrote {folder}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
