"""Real models' shapes per tensor-parallel rank, and what serving them through FP4 Marlin means.

The shapes are the models' Hugging Face ``config.json`` values (the repository each came from
is named in ``Model.source``): hidden_size, intermediate_size, num_attention_heads,
num_key_value_heads, head_dim (hidden_size / num_attention_heads where the config has none),
moe_intermediate_size (Mixtral: intermediate_size of its experts), num_experts
(num_local_experts), num_experts_per_tok. Qwen3 MoE and Mixtral have MoE experts in every
decoder layer, so no dense MLP.

The per-rank split is tensor parallelism as SGLang's parallel layers do it (column layers split
their outputs, row layers their inputs, KV heads are replicated once the TP size exceeds their
count); the Marlin rule is the kernel's tile set: K % 64 == 0 and N % 128 == 0, or K % 128 == 0
and N % 64 == 0 (the thread tiles 128x128, 64x128 and 128x64). What the layers must do per
layer: serve it, zero-pad it once at load to the smallest tile shape (dense: K first, it costs
an activation copy per call; MoE: the expert intermediate, exact since silu(0) * 0 = 0), or
refuse it with upstream's own message where no padding helps (a head count TP does not divide).

Pure Python: test_tensor_parallel.py beside it asserts it against SGLang's real layers and
The README's tensor-parallel table is rendered from it.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Model:
    name: str
    source: str  # the Hugging Face repository whose config.json gave the numbers
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int | None = None  # dense MLP; None: every decoder layer is MoE
    moe_intermediate: int | None = None
    experts: int | None = None
    top_k: int | None = None
    qkv_bias: bool = False

    @property
    def layers(self) -> tuple[str, ...]:
        mlp = ("gate_up", "down") if self.intermediate else ("experts",)
        return ("qkv", "o", *mlp)


MODELS: tuple[Model, ...] = (
    Model("Llama-3.1-8B", "meta-llama/Llama-3.1-8B", 4096, 32, 8, 128, intermediate=14336),
    Model("Llama-3.1-70B", "meta-llama/Llama-3.1-70B", 8192, 64, 8, 128, intermediate=28672),
    Model("Qwen2.5-7B", "Qwen/Qwen2.5-7B", 3584, 28, 4, 128, intermediate=18944, qkv_bias=True),
    Model("Qwen2.5-72B", "Qwen/Qwen2.5-72B", 8192, 64, 8, 128, intermediate=29568, qkv_bias=True),
    Model(
        "Qwen3-30B-A3B",
        "Qwen/Qwen3-30B-A3B",
        2048,
        32,
        4,
        128,
        moe_intermediate=768,
        experts=128,
        top_k=8,
    ),
    Model(
        "Qwen3-235B-A22B",
        "Qwen/Qwen3-235B-A22B",
        4096,
        64,
        4,
        128,
        moe_intermediate=1536,
        experts=128,
        top_k=8,
    ),
    Model(
        "Mixtral-8x7B",
        "mistralai/Mixtral-8x7B-v0.1",
        4096,
        32,
        8,
        128,
        moe_intermediate=14336,
        experts=8,
        top_k=2,
    ),
)
MODEL_BY_NAME = {m.name: m for m in MODELS}
TP_SIZES = (1, 2, 4, 8)
# the checkpoint prefix of each layer kind (layer 0 of a Llama / Qwen model)
PREFIX = {
    "qkv": "model.layers.0.self_attn.qkv_proj",
    "o": "model.layers.0.self_attn.o_proj",
    "gate_up": "model.layers.0.mlp.gate_up_proj",
    "down": "model.layers.0.mlp.down_proj",
    "experts": "model.layers.0.mlp.experts",
}
GROUP = 16  # NVFP4 block size along K


def marlin_tile_ok(n: int, k: int) -> bool:
    """Whether Marlin's FP4 GEMM has a thread tile for N x K."""
    return k % 64 == 0 and (n % 128 == 0 or (n % 64 == 0 and k % 128 == 0))


def _round_up(x: int, m: int) -> int:
    return (x + m - 1) // m * m


def dense_padded(n: int, k: int) -> tuple[int, int]:
    """The smallest tile shape >= (n, k), padding K as little as possible."""
    padded_k = _round_up(k, 64)
    padded_n = _round_up(n, 64 if padded_k % 128 == 0 else 128)
    return padded_n, padded_k


def moe_padded_intermediate(inter: int, hidden: int) -> int:
    """The smallest expert intermediate >= inter for which w13 and w2 both have a tile."""
    padded = _round_up(inter, GROUP)
    while not (marlin_tile_ok(2 * padded, hidden) and marlin_tile_ok(hidden, padded)):
        padded += GROUP
    return padded


@dataclass(frozen=True)
class Gemm:
    """One GEMM as the kernel sees it: logical N x K and the shape handed to Marlin."""

    name: str  # "linear", or "w13" / "w2" of the experts
    n: int
    k: int
    kernel_n: int
    kernel_k: int

    @property
    def padded(self) -> bool:
        return (self.kernel_n, self.kernel_k) != (self.n, self.k)


@dataclass(frozen=True)
class LayerCell:
    """One layer of one model at one TP size (every rank has the same shapes)."""

    model: Model
    layer: str  # qkv, o, gate_up, down, experts
    tp: int
    outcome: str  # served | padded | refused
    error: str | None = None  # refused: a substring of upstream's message
    shards: tuple[int, ...] = ()  # per-rank output partitions (experts: w1, w3)
    n: int = 0  # per-rank logical N x K (experts: the intermediate I and the hidden size)
    k: int = 0
    gemms: tuple[Gemm, ...] = field(default_factory=tuple)

    @property
    def key(self) -> str:
        return f"{self.model.name}-tp{self.tp}-{self.layer}"


def kv_heads_per_rank(model: Model, tp: int) -> tuple[int, int]:
    """(KV heads each rank holds, ranks sharing one KV head), as QKVParallelLinear splits them."""
    if tp >= model.kv_heads:
        return 1, tp // model.kv_heads
    return model.kv_heads // tp, 1


def _dense(model: Model, layer: str, tp: int, shards: tuple[int, ...], n: int, k: int) -> LayerCell:
    kn, kk = (n, k) if marlin_tile_ok(n, k) else dense_padded(n, k)
    gemm = Gemm("linear", n, k, kn, kk)
    return LayerCell(
        model,
        layer,
        tp,
        "padded" if gemm.padded else "served",
        shards=shards,
        n=n,
        k=k,
        gemms=(gemm,),
    )


def layer_cell(model: Model, layer: str, tp: int) -> LayerCell:
    """What the layers must do with LAYER of MODEL at tensor-parallel size TP."""
    hd, h = model.head_dim, model.hidden
    if layer == "qkv":
        if model.heads % tp:
            # QKVParallelLinear divides the heads by the TP size (upstream refuses too)
            return LayerCell(model, layer, tp, "refused", f"{model.heads} is not divisible by {tp}")
        kv, _ = kv_heads_per_rank(model, tp)
        shards = (model.heads // tp * hd, kv * hd, kv * hd)
        return _dense(model, layer, tp, shards, sum(shards), h)
    if layer == "o":
        return _dense(model, layer, tp, (h,), h, model.heads * hd // tp)
    if layer in ("gate_up", "down"):
        assert model.intermediate is not None
        inter = model.intermediate // tp
        if layer == "gate_up":
            return _dense(model, layer, tp, (inter, inter), 2 * inter, h)
        return _dense(model, layer, tp, (h,), h, inter)
    assert layer == "experts" and model.moe_intermediate is not None
    inter = model.moe_intermediate // tp
    padded = inter if marlin_tile_ok(2 * inter, h) and marlin_tile_ok(h, inter) else None
    padded = padded or moe_padded_intermediate(inter, h)
    gemms = (Gemm("w13", 2 * inter, h, 2 * padded, h), Gemm("w2", h, inter, h, padded))
    outcome = "padded" if padded != inter else "served"
    return LayerCell(model, layer, tp, outcome, shards=(inter, inter), n=inter, k=h, gemms=gemms)


def model_cells(model: Model, tp: int) -> list[LayerCell]:
    return [layer_cell(model, layer, tp) for layer in model.layers]


def all_cells() -> list[LayerCell]:
    return [c for m in MODELS for tp in TP_SIZES for c in model_cells(m, tp)]


def summary(model: Model, tp: int) -> str:
    """One README cell: served, padded (what, from -> to) or refused (why)."""
    cells = model_cells(model, tp)
    refused = [c for c in cells if c.outcome == "refused"]
    if refused:
        return f"refused ({refused[0].layer}: {refused[0].error})"
    padded = []
    for c in cells:
        if c.layer == "experts" and c.outcome == "padded":
            padded.append(f"experts I {c.n}->{c.gemms[1].kernel_k}")
            continue
        for g in c.gemms:
            if g.padded:
                what, size = (
                    ("N", (g.n, g.kernel_n)) if g.kernel_n != g.n else ("K", (g.k, g.kernel_k))
                )
                padded.append(f"{c.layer} {what} {size[0]}->{size[1]}")
    return f"padded: {', '.join(padded)}" if padded else "served"


def readme_table() -> str:
    """The README block: model x TP size -> served / padded / refused, and the shapes' source."""
    header = ["model (config.json)", *(f"--tp {tp}" for tp in TP_SIZES)]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for m in MODELS:
        row = [f"{m.name} (`{m.source}`)", *(summary(m, tp) for tp in TP_SIZES)]
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines) + "\n"
