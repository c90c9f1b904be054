"""A float64 PyTorch re-implementation of Touchstone's model, objective and optimizer.

Everything here follows the contract (docs/contract.md, docs/config.md, docs/data.md and docs/golden-format.md) and is meant to
be read top to bottom:

  1. the model (Llama-style, no biases): embedding, per layer RMSNorm -> grouped QKV projection ->
     RoPE -> masked GQA softmax attention (dropout on the probabilities) -> output projection ->
     dropout -> residual, RMSNorm -> SwiGLU MLP -> dropout -> residual, then a final RMSNorm and the
     output projection (the embedding when tied); the dropout masks come from dropout_masks.py;
  2. the per-position cross entropy and the two loss normalizations;
  3. one training update: autograd gradients, global norm, clipping, learning-rate schedule and a
     hand-written AdamW;
  4. `recompute_golden`, which replays every step of a golden file from its initial parameters and
     batches, carrying its own parameters from step to step (errors accumulate, nothing is reset).

Shapes use: B windows, T positions, H hidden, NH query heads, NKV key/value heads, D head size,
F SwiGLU inner size, V vocabulary, G = NH / NKV query heads per KV group.

Only torch, numpy, h5py and the standard library are used.
"""

import json
import math
from dataclasses import dataclass

import h5py
import numpy as np
import torch

import dropout_masks
import megatron_scheduler

DTYPE = torch.float64
IGNORE_INDEX = -100


# ----------------------------------------------------------------------------------------------
# Configuration
# ----------------------------------------------------------------------------------------------

@dataclass
class ModelShape:
    """The model hyper-parameters this file needs (config section `model`)."""
    vocab_size: int        # V
    hidden_size: int       # H
    num_layers: int        # L
    num_heads: int         # NH
    num_kv_heads: int      # NKV
    ffn_hidden_size: int   # F
    seq_length: int        # T
    norm_eps: float
    rope_theta: float
    tie_embeddings: bool

    @property
    def head_dim(self):    # D
        return self.hidden_size // self.num_heads

    @staticmethod
    def from_config(config):
        m = config["model"]
        return ModelShape(
            vocab_size=int(m["vocab_size"]), hidden_size=int(m["hidden_size"]),
            num_layers=int(m["num_layers"]), num_heads=int(m["num_heads"]),
            num_kv_heads=int(m["num_kv_heads"]), ffn_hidden_size=int(m["ffn_hidden_size"]),
            seq_length=int(m["seq_length"]), norm_eps=float(m["norm_eps"]),
            rope_theta=float(m["rope_theta"]), tie_embeddings=bool(m["tie_embeddings"]))


def parameter_shapes(shape):
    """The contract's parameter names (section 2) and full tensor shapes, in model order."""
    V, H, F = shape.vocab_size, shape.hidden_size, shape.ffn_hidden_size
    NH, NKV, D = shape.num_heads, shape.num_kv_heads, shape.head_dim
    shapes = {"embedding.word_embeddings.weight": (V, H)}
    for layer in range(shape.num_layers):
        prefix = f"decoder.layers.{layer}."
        shapes[prefix + "input_layernorm.weight"] = (H,)
        shapes[prefix + "self_attention.linear_qkv.weight"] = ((NH + 2 * NKV) * D, H)
        shapes[prefix + "self_attention.linear_proj.weight"] = (H, NH * D)
        shapes[prefix + "pre_mlp_layernorm.weight"] = (H,)
        shapes[prefix + "mlp.linear_fc1.weight"] = (2 * F, H)
        shapes[prefix + "mlp.linear_fc2.weight"] = (H, F)
    shapes["decoder.final_layernorm.weight"] = (H,)
    if not shape.tie_embeddings:
        shapes["output_layer.weight"] = (V, H)
    return shapes


# ----------------------------------------------------------------------------------------------
# 1. The model
# ----------------------------------------------------------------------------------------------

def rms_norm(x, weight, eps):
    """RMSNorm(x) * weight = x / sqrt(mean(x^2) + eps) * weight.   x: [..., H], weight: [H]."""
    mean_square = (x * x).mean(dim=-1, keepdim=True)          # [..., 1]
    return x / torch.sqrt(mean_square + eps) * weight          # [..., H]


def split_qkv(qkv, num_heads, num_kv_heads, head_dim):
    """Splits the fused projection using the per-KV-group row layout.

    The (NH + 2*NKV)*D output features are grouped per KV group g = 0..NKV-1, each group holding
    [the G = NH/NKV query heads of the group, key head g, value head g], every head D features.
    Query head h = g*G + j is the j-th query head of group g.

    qkv: [B, T, (NH + 2*NKV)*D]  ->  q: [B, NH, T, D], k: [B, NKV, T, D], v: [B, NKV, T, D]
    """
    B, T, _ = qkv.shape
    G = num_heads // num_kv_heads
    groups = qkv.view(B, T, num_kv_heads, G + 2, head_dim)             # [B, T, NKV, G+2, D]
    q = groups[:, :, :, :G, :].reshape(B, T, num_heads, head_dim)       # [B, T, NH, D]
    k = groups[:, :, :, G, :]                                           # [B, T, NKV, D]
    v = groups[:, :, :, G + 1, :]                                       # [B, T, NKV, D]
    return q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)


def rope_cos_sin(position_ids, head_dim, theta):
    """cos and sin of position * inv_freq, each frequency used for two features (rotate-half).

    inv_freq[i] = theta^(-2i/D), i = 0..D/2-1.   position_ids: [B, T] -> cos, sin: [B, T, D]
    """
    i = torch.arange(head_dim // 2, dtype=DTYPE)                        # [D/2]
    inv_freq = theta ** (-2.0 * i / head_dim)                           # [D/2]
    angles = position_ids.to(DTYPE)[..., None] * inv_freq               # [B, T, D/2]
    angles = torch.cat([angles, angles], dim=-1)                        # [B, T, D]
    return torch.cos(angles), torch.sin(angles)


def rotate_half(x):
    """[x1, x2] -> [-x2, x1], halves taken along the last dimension.   x: [..., D]"""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([-x2, x1], dim=-1)


def apply_rope(x, cos, sin):
    """x * cos + rotate_half(x) * sin.   x: [B, heads, T, D], cos/sin: [B, T, D]"""
    return x * cos[:, None] + rotate_half(x) * sin[:, None]


def attention_allowed(document_ids, document_masking):
    """Which keys each query may attend to.   document_ids: [B, T] -> allowed: [B, T(query), T(key)]

    Query i may attend key j iff j <= i and, with document masking,
    document_ids[i] == document_ids[j].
    Padding positions carry document id -1, so with masking they attend only to each other.
    """
    B, T = document_ids.shape
    causal = torch.ones(T, T, dtype=torch.bool).tril()                  # [T, T], [i, j] = j <= i
    allowed = causal.expand(B, T, T)                                    # [B, T, T]
    if document_masking:
        same_document = document_ids[:, :, None] == document_ids[:, None, :]   # [B, T, T]
        allowed = allowed & same_document
    return allowed


def masked_softmax_attention(q, k, v, allowed, keep_scale=None):
    """(softmax(q k^T / sqrt(D) + mask) * keep_scale) v with grouped-query attention.

    q: [B, NH, T, D], k, v: [B, NKV, T, D], allowed: [B, T, T]  ->  [B, NH, T, D]
    Query head h reads key/value head h // G, G = NH / NKV. keep_scale [B, NH, T, T] is the
    attention dropout mask (0 or 1/(1-p)), None without dropout.
    """
    num_heads, num_kv_heads, head_dim = q.shape[1], k.shape[1], q.shape[-1]
    G = num_heads // num_kv_heads
    k = k.repeat_interleave(G, dim=1)                                   # [B, NH, T, D]
    v = v.repeat_interleave(G, dim=1)                                   # [B, NH, T, D]
    scores = q @ k.transpose(-1, -2) / math.sqrt(head_dim)              # [B, NH, T, T]
    scores = scores.masked_fill(~allowed[:, None], float("-inf"))
    # Subtracting the row maximum does not change the softmax; it only avoids overflow. The
    # maximum is treated as a constant (detached), which is exact because the softmax is shift
    # invariant. Every row has at least one allowed key (j = i), so no row is all -inf.
    row_max = scores.max(dim=-1, keepdim=True).values.detach()          # [B, NH, T, 1]
    weights = torch.exp(scores - row_max)                               # [B, NH, T, T], 0 if masked
    probs = weights / weights.sum(dim=-1, keepdim=True)                 # [B, NH, T, T]
    if keep_scale is not None:
        probs = probs * keep_scale                                      # [B, NH, T, T]
    return probs @ v                                                    # [B, NH, T, D]


def silu(x):
    return x * torch.sigmoid(x)


def dropout(x, keep_scale):
    """Inverted dropout with a given mask: x * keep_scale, or x when there is none."""
    return x if keep_scale is None else x * keep_scale


def decoder_layer(x, params, layer, shape, cos, sin, allowed, masks=None):
    """One pre-norm transformer layer.   x: [B, T, H] -> [B, T, H]

    masks: this layer's dropout masks {"attention": [B, NH, T, T], "hidden_attn": [B, T, H],
    "hidden_mlp": [B, T, H]}, each None when its dropout is off; None for no dropout at all.
    """
    masks = masks or {"attention": None, "hidden_attn": None, "hidden_mlp": None}
    p = lambda name: params[f"decoder.layers.{layer}.{name}"]
    B, T, H = x.shape
    NH, NKV, D, F = shape.num_heads, shape.num_kv_heads, shape.head_dim, shape.ffn_hidden_size

    # Attention block.
    h = rms_norm(x, p("input_layernorm.weight"), shape.norm_eps)                  # [B, T, H]
    qkv = h @ p("self_attention.linear_qkv.weight").T                         # [B, T, (NH+2NKV)*D]
    q, k, v = split_qkv(qkv, NH, NKV, D)                       # [B, NH, T, D], [B, NKV, T, D] x 2
    q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
    a = masked_softmax_attention(q, k, v, allowed, masks["attention"])           # [B, NH, T, D]
    a = a.transpose(1, 2).reshape(B, T, NH * D)                                  # [B, T, NH*D]
    attention_out = a @ p("self_attention.linear_proj.weight").T                 # [B, T, H]
    x = x + dropout(attention_out, masks["hidden_attn"])                         # [B, T, H]

    # SwiGLU MLP block.
    h = rms_norm(x, p("pre_mlp_layernorm.weight"), shape.norm_eps)               # [B, T, H]
    f = h @ p("mlp.linear_fc1.weight").T                                         # [B, T, 2F]
    gate, up = f[..., :F], f[..., F:]                                            # [B, T, F] each
    mlp_out = (silu(gate) * up) @ p("mlp.linear_fc2.weight").T                  # [B, T, H]
    x = x + dropout(mlp_out, masks["hidden_mlp"])                                # [B, T, H]
    return x


def forward(params, tokens, position_ids, document_ids, shape, document_masking, masks=None):
    """Logits of the model.   tokens, position_ids, document_ids: [B, T] (int64) -> [B, T, V]

    masks: per layer, the dropout masks (dropout_masks.layer_masks as tensors); None for none.
    """
    embedding = params["embedding.word_embeddings.weight"]                       # [V, H]
    x = embedding[tokens]                                                        # [B, T, H]
    cos, sin = rope_cos_sin(position_ids, shape.head_dim, shape.rope_theta)      # [B, T, D] x 2
    allowed = attention_allowed(document_ids, document_masking)                  # [B, T, T]
    for layer in range(shape.num_layers):
        layer_masks = masks[layer] if masks else None
        x = decoder_layer(x, params, layer, shape, cos, sin, allowed, layer_masks)
    x = rms_norm(x, params["decoder.final_layernorm.weight"], shape.norm_eps)    # [B, T, H]
    output = embedding if shape.tie_embeddings else params["output_layer.weight"]  # [V, H]
    return x @ output.T                                                          # [B, T, V]


# ----------------------------------------------------------------------------------------------
# 2. Cross entropy and the objective
# ----------------------------------------------------------------------------------------------

def token_cross_entropy(logits, targets):
    """Per-position cross entropy, 0 where the target is -100.

    logits: [B, T, V], targets: [B, T] (int64)  ->  [B, T]
    """
    valid = targets != IGNORE_INDEX                                              # [B, T]
    safe_targets = torch.where(valid, targets, torch.zeros_like(targets))        # [B, T]
    log_normalizer = torch.logsumexp(logits, dim=-1)                             # [B, T]
    target_logit = logits.gather(-1, safe_targets[..., None])[..., 0]            # [B, T]
    losses = log_normalizer - target_logit                                       # [B, T]
    return torch.where(valid, losses, torch.zeros_like(losses))


def objective(token_losses, targets, normalization, micro_batch_size):
    """The scalar whose gradient is trained on.   token_losses, targets: [B, T]

    global_token_mean:   sum of all token losses / number of loss tokens in the global batch.
    per_microbatch_mean: mean over the B/mbs micro-batches (consecutive groups of mbs windows) of
                         each micro-batch's loss sum / max(its loss-token count, 1).
    """
    valid = (targets != IGNORE_INDEX).to(DTYPE)                                  # [B, T]
    if normalization == "global_token_mean":
        return token_losses.sum() / valid.sum()
    if normalization == "per_microbatch_mean":
        B = token_losses.shape[0]
        assert B % micro_batch_size == 0, "global batch must split into whole micro-batches"
        M = B // micro_batch_size
        sums = token_losses.reshape(M, -1).sum(dim=1)                            # [M]
        counts = valid.reshape(M, -1).sum(dim=1).clamp(min=1.0)                  # [M]
        return (sums / counts).mean()
    raise ValueError(f"unknown loss normalization {normalization!r}")


# ----------------------------------------------------------------------------------------------
# 3. The update
# ----------------------------------------------------------------------------------------------

def learning_rate(step, optim):
    """LR of update `step` (1-based) under optim.schedule_convention (docs/contract.md "Update"):
    touchstone: linear warmup from warmup_init, then cosine from lr to min_lr, then min_lr;
    megatron: Megatron-LM's scheduler, stepped after each update (megatron_scheduler.py)."""
    if optim.get("schedule_convention", "touchstone") == "megatron":
        return megatron_scheduler.rate(step, optim)
    lr, min_lr, init = float(optim["lr"]), float(optim["min_lr"]), float(optim.get("warmup_init", 0.0))
    warmup, decay = int(optim["warmup_steps"]), int(optim["decay_steps"])
    if warmup > 0 and step <= warmup:
        return init + (lr - init) * step / warmup
    if step <= decay:  # here warmup < step <= decay
        progress = (step - warmup) / (decay - warmup)
        return min_lr + 0.5 * (lr - min_lr) * (1.0 + math.cos(math.pi * progress))
    return min_lr


def global_grad_norm(grads):
    """L2 norm over every element of every gradient tensor."""
    return math.sqrt(sum(float((g * g).sum()) for g in grads.values()))


def adamw_update(params, grads, state, step, lr, optim):
    """One AdamW update written out (PyTorch's form, bias-corrected), returning new tensors.

    m = b1*m + (1-b1)*g;  v = b2*v + (1-b2)*g^2
    p <- p*(1 - lr*wd) - lr * (m/(1-b1^step)) / (sqrt(v/(1-b2^step)) + eps)
    Weight decay only for tensors with two or more dimensions (not the norm weights).
    `state` maps name -> (m, v) and is updated in place.
    """
    b1, b2 = float(optim["beta1"]), float(optim["beta2"])
    eps, wd = float(optim["eps"]), float(optim["weight_decay"])
    bias_correction1 = 1.0 - b1 ** step
    bias_correction2 = 1.0 - b2 ** step
    new_params = {}
    for name, p in params.items():
        g = grads[name]
        m, v = state.get(name, (torch.zeros_like(p), torch.zeros_like(p)))
        m = b1 * m + (1.0 - b1) * g
        v = b2 * v + (1.0 - b2) * g * g
        state[name] = (m, v)
        decay = wd if p.dim() >= 2 else 0.0
        m_hat, v_hat = m / bias_correction1, v / bias_correction2
        new_params[name] = p * (1.0 - lr * decay) - lr * m_hat / (torch.sqrt(v_hat) + eps)
    return new_params


@dataclass
class StepResult:
    """What one training step produces, with the golden file's meaning for each field."""
    loss: float
    num_loss_tokens: int
    token_losses: torch.Tensor      # [B, T]
    grads: dict                     # name -> tensor, before clipping
    grad_norm: float
    lr: float
    params: dict                    # name -> tensor, after the update


@dataclass
class Settings:
    """Everything besides the parameters that a training step depends on."""
    shape: ModelShape
    document_masking: bool
    loss_normalization: str
    micro_batch_size: int
    optim: dict
    attention_dropout: float = 0.0
    hidden_dropout: float = 0.0
    seed: int = 0                   # train.seed: keys the dropout masks

    @staticmethod
    def from_config(config):
        return Settings(
            shape=ModelShape.from_config(config),
            document_masking=bool(config["data"]["document_masking"]),
            loss_normalization=str(config["train"]["loss_normalization"]),
            micro_batch_size=int(config["train"]["micro_batch_size"]),
            optim=dict(config["optim"]),
            attention_dropout=float(config["model"].get("attention_dropout", 0.0)),
            hidden_dropout=float(config["model"].get("hidden_dropout", 0.0)),
            seed=int(config["train"]["seed"]))


def train_step(params, state, batch, step, settings):
    """Forward, backward and AdamW update for update number `step` (1-based).

    params: name -> tensor; state: AdamW moments (updated in place);
    batch: dict of int64 tensors tokens, targets, position_ids, document_ids, each [B, T].
    """
    leaves = {name: p.detach().clone().requires_grad_(True) for name, p in params.items()}
    B = batch["tokens"].shape[0]
    samples = np.arange((step - 1) * B, step * B)        # the global sample index of each window
    masks = None
    if settings.attention_dropout > 0 or settings.hidden_dropout > 0:
        masks = [{site: None if mask is None else torch.from_numpy(mask)
                  for site, mask in layer.items()}
                 for layer in dropout_masks.layer_masks(settings.shape, settings.attention_dropout,
                                                        settings.hidden_dropout, settings.seed,
                                                        samples)]
    logits = forward(leaves, batch["tokens"], batch["position_ids"], batch["document_ids"],
                     settings.shape, settings.document_masking, masks)           # [B, T, V]
    token_losses = token_cross_entropy(logits, batch["targets"])                 # [B, T]
    loss = objective(token_losses, batch["targets"], settings.loss_normalization,
                     settings.micro_batch_size)
    names = list(leaves)
    grad_list = torch.autograd.grad(loss, [leaves[n] for n in names])
    grads = {n: g.detach() for n, g in zip(names, grad_list)}

    norm = global_grad_norm(grads)
    clip = float(settings.optim["clip_grad"])
    scale = min(1.0, clip / (norm + 1e-6)) if clip > 0 else 1.0
    clipped = {n: g * scale for n, g in grads.items()}
    lr = learning_rate(step, settings.optim)
    with torch.no_grad():
        new_params = adamw_update({n: p.detach() for n, p in params.items()}, clipped, state,
                                  step, lr, settings.optim)
    num_loss_tokens = int((batch["targets"] != IGNORE_INDEX).sum())
    return StepResult(loss=float(loss), num_loss_tokens=num_loss_tokens,
                      token_losses=token_losses.detach(), grads=grads, grad_norm=norm, lr=lr,
                      params=new_params)


# ----------------------------------------------------------------------------------------------
# 4. Replaying a golden file
# ----------------------------------------------------------------------------------------------

def as_str(value):
    """h5py returns string attributes as str or bytes depending on how they were written."""
    if isinstance(value, bytes):
        return value.decode("utf-8")
    if isinstance(value, np.ndarray) and value.shape == ():
        return as_str(value[()])
    return str(value)


def read_config(golden):
    """The resolved config stored as JSON in the root attribute `config`."""
    return json.loads(as_str(golden.attrs["config"]))


def read_batch(golden, step):
    """The global batch of update `step` (1-based) as int64 tensors [B, T]."""
    return {key: torch.from_numpy(golden["batch"][key][step - 1].astype(np.int64))
            for key in ("tokens", "targets", "position_ids", "document_ids")}


def read_init_params(golden):
    return {name: torch.from_numpy(np.asarray(ds[()], dtype=np.float64))
            for name, ds in golden["params"]["init"].items()}


def recompute_golden(path, settings_override=None, max_steps=None):
    """Replays every recorded step of the golden file at `path` with this reference.

    Step s trains on /batch/*[s-1] starting from the parameters this code produced at step s-1
    (from /params/init for step 1). `settings_override(settings) -> settings` may change the
    settings (used to show that a wrong objective or mask is detected). Returns [StepResult, ...].
    """
    with h5py.File(path, "r") as golden:
        settings = Settings.from_config(read_config(golden))
        if settings_override is not None:
            settings = settings_override(settings)
        params = read_init_params(golden)
        num_steps = len(golden["steps"])
        if max_steps is not None:
            num_steps = min(num_steps, max_steps)
        batches = [read_batch(golden, s) for s in range(1, num_steps + 1)]
    state, results = {}, []
    for step, batch in enumerate(batches, start=1):
        result = train_step(params, state, batch, step, settings)
        results.append(result)
        params = result.params
    return results
