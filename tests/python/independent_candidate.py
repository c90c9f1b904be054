#!/usr/bin/python3
"""An independent candidate trainer for `touchstone diff`, written from docs/contract.md and
docs/precision.md.

Given a golden file it reads the resolved config (root attribute `config`), the initial parameters
(/params/init) and each step's global batch (/batch/*), trains micro-batch by micro-batch and writes a
candidate HDF5 file in the golden schema (docs/golden-format.md):

    params/init/<name>                  the parameters it started from (its own master copy)
    steps/<s>/loss                      the objective of step s (the quantity differentiated)
    steps/<s>/num_loss_tokens           its own count of loss tokens
    steps/<s>/token_losses              per-position cross entropy, 0 where there is no target
    steps/<s>/grads/<name>              after the (here trivial) data-parallel sum, before clipping
    steps/<s>/grad_norm, steps/<s>/lr
    steps/<s>/params/<name>             after update s
    steps/<s>/optimizer/exp_avg|exp_avg_sq/<name>   with --save-optimizer-state

Root attribute `generator` = "independent_candidate.py".

Two arithmetic modes (--precision; default bf16 for a BF16 golden file or BF16 envelope, else fp64):

  fp64  everything in float64; must match an FP64 golden file to ~1e-13.
  bf16  mixed precision the way production runs it (Megatron-LM with gradient-accumulation fusion,
        PyTorch autocast), deliberately NOT a copy of Touchstone's own rounding points:
          - FP32 master weights; a BF16 copy of each weight is what the passes read;
          - every GEMM (linear layers, q k^T, P v) takes BF16 inputs, accumulates in FP32 (an FP32
            GEMM on the exactly converted inputs) and rounds its output once to BF16; the attention
            scale 1/sqrt(D) is applied in FP32 before that rounding (baddbmm's alpha);
          - linear-layer weight gradients are FP32 GEMM results added straight into FP32 main
            gradients (gradient-accumulation fusion); the embedding and norm-weight gradients are
            computed in FP32, rounded to BF16 (the BF16 parameter's .grad, as Apex / Transformer
            Engine norms and the embedding backward return them) and added into the FP32 main
            gradients micro-batch by micro-batch;
          - RMSNorm: mean square and rstd in FP32, output rounded once to BF16 (fused-norm style);
          - RoPE as Megatron-LM's unfused path: angles in FP32, cos and sin rounded to BF16, then
            t * cos + rotate_half(t) * sin in BF16 (each elementwise op rounds);
          - attention softmax in FP32 on the BF16 scores, probabilities fed to P v in BF16; its
            backward in FP32, dS rounded to BF16 for the next GEMMs;
          - SwiGLU as silu(gate) * up in BF16 (two roundings); residual stream in BF16;
          - cross entropy in FP32 on the BF16 logits; dlogits rounded to BF16;
          - gradient norm, clipping and AdamW in FP32 (torch.optim.AdamW's arithmetic, op for op).

--inject BUG (repeatable, or a comma-separated list) plants a known mistake; it is active in the
steps >= --inject-from-step (default 1) only. Gradients recorded are the candidate's own (with the
bug), so an optimizer bug leaves the gradients right and only the parameters wrong.

    per_microbatch_mean, global_token_mean
                          the named loss normalisation, which must be the other one than the
                          golden file's
    grad_half             every gradient divided by 2 (an extra data-parallel division), before
                          clipping and recording
    qkv_wrong_grouping    linear_qkv rows read as [all q heads; all k heads; all v heads] instead of
                          per KV group [its q heads; k; v]; the gradient comes back in the same
                          (wrong) reading
    qkv_split_in_conversion  linear_qkv split as [all q; all k; all v] when converting to separate
                          q/k/v projections (a Hugging Face loader's mistake): the model computes as
                          qkv_wrong_grouping, and every linear_qkv tensor it writes is converted back
                          correctly, per KV group
    no_document_mask      plain causal attention across documents (positions as recorded)
    padding_in_loss       padding positions (document id -1) trained to predict the pad token
    padding_in_loss_strict  the same, and the last real token before the padding (whose next token
                          is padding, so docs/data.md leaves it untrained) trained to predict pad too
    fp32_sites            (fp64 only) what Hugging Face Llama does inside a float64 model: RoPE
                          inv_freq, cos and sin in float32, RMSNorm normalised in float32,
                          softmax in float32, each cast back to float64
    no_bias_correction    AdamW without bias correction
    wd_on_norms           weight decay on every tensor, norm weights included
    clip_after_moments    the moments accumulate the unclipped gradients; the clip coefficient
                          scales the update instead (visible only in steps where clipping is active)
    step_before_last_w    the optimizer steps before the last micro-batch's deferred weight-gradient
                          pass of a split backward (zero-bubble pipelines): the linear layers' and the
                          embedding's gradients lack that micro-batch's share, the norm weights have it
    zero3_not_regathered  ZeRO-3 / FSDP without the gather before each layer's backward: the input
                          gradients through the linear layers of decoder layers 0..L-2 use layer L-1's
                          weights (the unsharded buffer the forward's last gather left); the weight
                          gradients are right for the gradients they receive
    tied_embedding_reduced_twice
                          (tied embeddings only) the all-reduce of the tied embedding's gradient over
                          the first and last pipeline stage runs twice, as a loop over virtual
                          pipeline chunks that reduces once per chunk would: that gradient doubles,
                          every other gradient is right
    cp2_default_normalization
                          Megatron-LM's default normalisation under context parallelism 2: each
                          CP rank (rank 0: chunks 0 and 3 of the window cut in 4, rank 1: chunks 1
                          and 2) divides its token-loss sum by its own loss-token count (clamped at
                          1) and the number of micro-batches, the gradients averaged over the 2
                          ranks (forward_step_calc_loss, megatron/core/pipeline_parallel/schedules.py)
    cp2_token_count_not_reduced
                          (global_token_mean only) a run at context parallelism 2 whose loss-token
                          count is not all-reduced over the cp group: each CP rank (chunks as above)
                          divides its token-loss sum by its own count over the global batch, the
                          gradients summed over the ranks; the recorded count is CP rank 0's
    cp2_merge_without_lse ring attention at cp = 2 adding each K/V block's output as it is: every
                          query's output is the sum, over the 2 ranks' key blocks (chunks 0 and 3,
                          1 and 2), of softmax attention normalised over that block's keys alone
                          (0 where the block holds no key it may see), without the log-sum-exp weights
    cp2_chunks_not_load_balanced
                          cp = 2 ranks holding contiguous halves of each window (tokens, targets,
                          document ids) while the positions are the load-balanced split's: slot i
                          of the window gets the RoPE position id and the causal-mask position of
                          the load-balanced row at the same slot of the same rank (rank 0: chunks
                          0 and 3, rank 1: chunks 1 and 2)
    schedule_megatron, schedule_touchstone
                          the learning rates of the named optim.schedule_convention, which must be
                          the other one than the golden file's: schedule_megatron is a Megatron-LM
                          run with the golden schedule's values as its flags (update s at the
                          rate after s-1 scheduler steps, megatron_scheduler.py)

Usage:
    independent_candidate.py GOLDEN.h5 --out CANDIDATE.h5 [--precision fp64|bf16] [--steps N]
        [--inject BUG[,BUG...]] [--inject-from-step N] [--save-optimizer-state]
    touchstone diff GOLDEN.h5 CANDIDATE.h5

Not supported: dropout (model.attention_dropout / hidden_dropout > 0). Needs torch, numpy and h5py
(Debian's /usr/bin/python3).
"""

import argparse
import json
import math
import os
import sys

import h5py
import numpy as np
import torch

import megatron_scheduler

IGNORE = -100
BF16, FP32, FP64 = torch.bfloat16, torch.float32, torch.float64

BUGS = ("per_microbatch_mean", "global_token_mean", "grad_half", "qkv_wrong_grouping", "qkv_split_in_conversion",
        "no_document_mask",
        "padding_in_loss", "padding_in_loss_strict", "fp32_sites", "no_bias_correction", "wd_on_norms",
        "clip_after_moments", "schedule_megatron", "schedule_touchstone", "cp2_default_normalization",
        "step_before_last_w", "zero3_not_regathered", "tied_embedding_reduced_twice",
        "cp2_token_count_not_reduced", "cp2_merge_without_lse", "cp2_chunks_not_load_balanced")
GENERATOR = "independent_candidate.py"


# ---------------------------------------------------------------------------------------------------
# Parameter names and shapes (docs/golden-format.md, "Parameters")
# ---------------------------------------------------------------------------------------------------

def parameter_shapes(m):
    V, H, F, L = m["vocab_size"], m["hidden_size"], m["ffn_hidden_size"], m["num_layers"]
    NH, NKV = m["num_heads"], m["num_kv_heads"]
    D = H // NH
    shapes = {"embedding.word_embeddings.weight": (V, H)}
    for l in range(L):
        p = f"decoder.layers.{l}."
        shapes[p + "input_layernorm.weight"] = (H,)
        shapes[p + "self_attention.linear_qkv.weight"] = ((NH + 2 * NKV) * D, H)
        shapes[p + "self_attention.linear_proj.weight"] = (H, NH * D)
        shapes[p + "pre_mlp_layernorm.weight"] = (H,)
        shapes[p + "mlp.linear_fc1.weight"] = (2 * F, H)
        shapes[p + "mlp.linear_fc2.weight"] = (H, F)
    shapes["decoder.final_layernorm.weight"] = (H,)
    if not m["tie_embeddings"]:
        shapes["output_layer.weight"] = (V, H)
    return shapes


# ---------------------------------------------------------------------------------------------------
# Arithmetic: the FP64 operators, and the BF16 mixed-precision ones with their own rounding points
# ---------------------------------------------------------------------------------------------------

def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat([-x[..., half:], x[..., :half]], dim=-1)


class Fp64:
    """Every operator in float64; with fp32_sites, the float32 islands of Hugging Face's Llama."""

    master = FP64

    def __init__(self, fp32_sites=False):
        self.fp32_sites = fp32_sites

    def embedding(self, E, tokens):
        return E[tokens]

    def linear(self, x, w):                      # x [..., K], w [N, K] -> [..., N]
        return x @ w.t()

    def matmul(self, a, b, alpha=1.0):
        out = a @ b
        return out * alpha if alpha != 1.0 else out

    def rms_norm(self, x, w, eps):
        if self.fp32_sites:  # LlamaRMSNorm: normalise in float32, cast back, then the weight
            xf = x.to(FP32)
            xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
            return w * xf.to(x.dtype)
        return x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps) * w

    def rope_cos_sin(self, positions, D, theta):   # positions [b, T] -> [b, 1, T, D] each
        if self.fp32_sites:  # LlamaRotaryEmbedding: inv_freq, angles, cos and sin in float32
            inv_freq = 1.0 / (theta ** (torch.arange(0, D, 2, dtype=torch.int64).float() / D))
            angles = positions.float()[..., None] * inv_freq[None, None, :]
            angles = torch.cat([angles, angles], dim=-1)
            return angles.cos().to(FP64)[:, None], angles.sin().to(FP64)[:, None]
        inv_freq = theta ** (-2.0 * torch.arange(D // 2, dtype=FP64) / D)
        angles = positions.to(FP64)[..., None] * inv_freq
        angles = torch.cat([angles, angles], dim=-1)
        return angles.cos()[:, None], angles.sin()[:, None]

    def softmax(self, scores, allowed):
        scores = scores.masked_fill(~allowed, float("-inf"))
        if self.fp32_sites:  # softmax(..., dtype=torch.float32).to(query dtype)
            return torch.softmax(scores, dim=-1, dtype=FP32).to(FP64)
        return torch.softmax(scores, dim=-1)

    def logits_for_loss(self, logits):
        return logits


class _Linear16(torch.autograd.Function):
    """y = x W^T: BF16 x and BF16 copy of the FP32 master W, FP32 accumulation, BF16 output.
    Backward: dx the same way; dW an FP32 GEMM returned to the FP32 master (gradient-accumulation
    fusion: autograd adds it into the FP32 .grad micro-batch after micro-batch)."""

    @staticmethod
    def forward(ctx, x, master):
        w = master.to(BF16)
        ctx.save_for_backward(x, w)
        return (x.float() @ w.float().t()).to(BF16)

    @staticmethod
    def backward(ctx, dy):
        x, w = ctx.saved_tensors
        dyf = dy.to(BF16).float()
        dx = (dyf @ w.float()).to(BF16)
        dw = dyf.reshape(-1, dyf.shape[-1]).t() @ x.float().reshape(-1, x.shape[-1])
        return dx, dw


class _RMSNorm16(torch.autograd.Function):
    """Fused RMSNorm on BF16 input: statistics in FP32, output rounded once to BF16. The weight
    gradient is computed in FP32 and returned in the weight's BF16 (then added in FP32)."""

    @staticmethod
    def forward(ctx, x, master, eps):
        xf = x.float()
        w = master.to(BF16).float()
        rstd = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
        ctx.save_for_backward(x, w, rstd)
        return (xf * rstd * w).to(BF16)

    @staticmethod
    def backward(ctx, dy):
        x, w, rstd = ctx.saved_tensors
        xhat = x.float() * rstd
        dyf = dy.to(BF16).float()
        dw = (dyf * xhat).reshape(-1, xhat.shape[-1]).sum(0)
        g = dyf * w
        dx = rstd * (g - xhat * (g * xhat).mean(-1, keepdim=True))
        return dx.to(BF16), dw.to(BF16).float(), None


class _Embedding16(torch.autograd.Function):
    """Lookup in the BF16 copy; the gradient summed in FP32, returned as BF16 (the parameter's .grad)."""

    @staticmethod
    def forward(ctx, master, tokens):
        ctx.save_for_backward(tokens)
        ctx.shape = master.shape
        return master.to(BF16)[tokens]

    @staticmethod
    def backward(ctx, dx):
        (tokens,) = ctx.saved_tensors
        flat = dx.to(BF16).float().reshape(-1, ctx.shape[1])
        dE = torch.zeros(ctx.shape, dtype=FP32).index_add_(0, tokens.reshape(-1), flat)
        return dE.to(BF16).float(), None


class Bf16:
    """Mixed precision: FP32 masters, BF16 activations, FP32 accumulation, FP32 softmax and loss."""

    master = FP32

    def embedding(self, E, tokens):
        return _Embedding16.apply(E, tokens)

    def linear(self, x, w):
        return _Linear16.apply(x, w)

    def matmul(self, a, b, alpha=1.0):           # activation x activation GEMM (q k^T, P v)
        out = a.float() @ b.float()
        if alpha != 1.0:
            out = out * alpha
        return out.to(BF16)

    def rms_norm(self, x, w, eps):
        return _RMSNorm16.apply(x, w, eps)

    def rope_cos_sin(self, positions, D, theta):
        inv_freq = 1.0 / (theta ** (torch.arange(0, D, 2, dtype=FP32) / D))
        angles = positions.float()[..., None] * inv_freq
        angles = torch.cat([angles, angles], dim=-1)
        return angles.cos().to(BF16)[:, None], angles.sin().to(BF16)[:, None]

    def softmax(self, scores, allowed):
        probs = torch.softmax(scores.float().masked_fill(~allowed, float("-inf")), dim=-1)
        return probs.to(BF16)

    def logits_for_loss(self, logits):
        return logits.float()


# ---------------------------------------------------------------------------------------------------
# The model (docs/contract.md, "Model")
# ---------------------------------------------------------------------------------------------------

def split_qkv(qkv, NH, NKV, D, wrong_grouping):
    """[b, T, (NH+2NKV)D] -> q [b, NH, T, D], k and v [b, NKV, T, D]."""
    b, T, _ = qkv.shape
    if wrong_grouping:  # [all q heads; all k heads; all v heads]
        q = qkv[..., :NH * D].reshape(b, T, NH, D)
        k = qkv[..., NH * D:(NH + NKV) * D].reshape(b, T, NKV, D)
        v = qkv[..., (NH + NKV) * D:].reshape(b, T, NKV, D)
    else:  # per KV group g: its G query heads, key head g, value head g
        G = NH // NKV
        groups = qkv.reshape(b, T, NKV, G + 2, D)
        q = groups[:, :, :, :G].reshape(b, T, NH, D)
        k, v = groups[:, :, :, G], groups[:, :, :, G + 1]
    return q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)


def forward(ar, params, m, tokens, positions, allowed, qkv_wrong_grouping, not_regathered=False,
            key_blocks=None):
    """Logits [b, T, V] in the mode's activation type. key_blocks (cp2_merge_without_lse): one [T] bool
    mask of keys per context-parallel rank, each block's attention normalised alone and the outputs added."""
    H, NH, NKV, F = m["hidden_size"], m["num_heads"], m["num_kv_heads"], m["ffn_hidden_size"]
    D, G, eps = H // NH, m["num_heads"] // m["num_kv_heads"], float(m["norm_eps"])
    b, T = tokens.shape
    L = m["num_layers"]
    E = params["embedding.word_embeddings.weight"]
    x = ar.embedding(E, tokens)
    cos, sin = ar.rope_cos_sin(positions, D, float(m["rope_theta"]))
    mask = allowed[:, None]                                               # [b, 1, T, T]
    for l in range(L):
        p = lambda name: params[f"decoder.layers.{l}.{name}"]

        def linear(h, name, l=l, p=p):
            if not (not_regathered and l < L - 1):
                return ar.linear(h, p(name))
            # zero3_not_regathered: the same output; dx flows through layer L-1's weight, dW through h.
            stale = ar.linear(h, params[f"decoder.layers.{L - 1}.{name}"].detach())
            return ar.linear(h.detach(), p(name)) + (stale - stale.detach())

        h = ar.rms_norm(x, p("input_layernorm.weight"), eps)
        q, k, v = split_qkv(linear(h, "self_attention.linear_qkv.weight"), NH, NKV, D, qkv_wrong_grouping)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        k, v = k.repeat_interleave(G, dim=1), v.repeat_interleave(G, dim=1)
        scores = ar.matmul(q, k.transpose(-1, -2), 1.0 / math.sqrt(D))
        if key_blocks is None:
            a = ar.matmul(ar.softmax(scores, mask), v)
        else:
            a = 0
            for keys in key_blocks:
                block = mask & keys
                sees = block.any(dim=-1, keepdim=True)       # a row with no key in the block adds 0
                a = a + ar.matmul(ar.softmax(scores, block | ~sees) * sees, v)
        a = a.transpose(1, 2).reshape(b, T, NH * D)
        x = x + linear(a, "self_attention.linear_proj.weight")
        h = ar.rms_norm(x, p("pre_mlp_layernorm.weight"), eps)
        f = linear(h, "mlp.linear_fc1.weight")
        gate, up = f[..., :F], f[..., F:]
        x = x + linear(torch.nn.functional.silu(gate) * up, "mlp.linear_fc2.weight")
    x = ar.rms_norm(x, params["decoder.final_layernorm.weight"], eps)
    out = E if m["tie_embeddings"] else params["output_layer.weight"]
    return ar.linear(x, out)


def token_cross_entropy(logits, targets):
    """[b, T, V], [b, T] -> [b, T], 0 where the target is -100."""
    valid = targets != IGNORE
    safe = torch.where(valid, targets, torch.zeros_like(targets))
    losses = torch.logsumexp(logits, dim=-1) - logits.gather(-1, safe[..., None])[..., 0]
    return torch.where(valid, losses, torch.zeros_like(losses))


# ---------------------------------------------------------------------------------------------------
# Data rules (docs/data.md) and the buggy variants
# ---------------------------------------------------------------------------------------------------

def attention_allowed(document_ids, masking, window_positions=None):
    """[b, T, T]: key j <= query i in the window (or by window_positions [T]), and in its document."""
    b, T = document_ids.shape
    p = torch.arange(T) if window_positions is None else window_positions
    allowed = (p[None, :] <= p[:, None]).expand(b, T, T)
    if masking:
        allowed = allowed & (document_ids[:, :, None] == document_ids[:, None, :])
    return allowed


def buggy_targets(batch, data, bugs):
    """The golden targets, or with padding trained to predict the pad token."""
    targets = batch["targets"].clone()
    docs = batch["document_ids"]
    if "padding_in_loss" in bugs or "padding_in_loss_strict" in bugs:
        padding = docs == -1
        if "padding_in_loss_strict" in bugs:  # and the last real position before padding
            before = torch.zeros_like(padding)
            before[:, :-1] = (docs[:, :-1] != -1) & (docs[:, 1:] == -1)
            padding = padding | before
        targets[padding] = int(data["pad_token"])
    return targets


# ---------------------------------------------------------------------------------------------------
# The update (docs/contract.md, "Update")
# ---------------------------------------------------------------------------------------------------

def learning_rate(step, o, convention, global_batch):
    """The rate of update `step` under `convention` (docs/contract.md "Update"): touchstone, the
    schedule at `step`; megatron, Megatron-LM's scheduler counting samples as it does."""
    if convention == "megatron":
        return megatron_scheduler.rate(step, o, global_batch)
    lr, min_lr, W, decay = float(o["lr"]), float(o["min_lr"]), int(o["warmup_steps"]), int(o["decay_steps"])
    init = float(o.get("warmup_init", 0.0))
    if step <= W:
        return init + (lr - init) * step / W
    if step <= decay:
        return min_lr + 0.5 * (lr - min_lr) * (1.0 + math.cos(math.pi * (step - W) / (decay - W)))
    return min_lr


def adamw_(params, grads, state, step, lr, o, decay_all=False, bias_correction=True, update_scale=1.0):
    """torch.optim.AdamW's single-tensor update, op for op, in the parameters' own dtype, in place.
    Weight decay only on tensors of >= 2 dimensions unless decay_all; update_scale multiplies the
    step size (the clip coefficient when it is wrongly applied after the moments)."""
    b1, b2, eps = float(o["beta1"]), float(o["beta2"]), float(o["eps"])
    for name, p in params.items():
        g = grads[name]
        if name not in state:
            state[name] = (torch.zeros_like(p), torch.zeros_like(p))
        m, v = state[name]
        wd = float(o["weight_decay"]) if (p.dim() >= 2 or decay_all) else 0.0
        p.mul_(1 - lr * wd)
        m.mul_(b1).add_(g, alpha=1 - b1)
        v.mul_(b2).addcmul_(g, g, value=1 - b2)
        bc1 = 1 - b1 ** step if bias_correction else 1.0
        bc2 = 1 - b2 ** step if bias_correction else 1.0
        step_size = lr / bc1 * update_scale
        denom = (v.sqrt() / math.sqrt(bc2)).add_(eps)
        p.addcdiv_(m, denom, value=-step_size)


def adamw_matches_torch(steps=3, seed=0):
    """adamw_ against torch.optim.AdamW (two groups: decay on 2-D, none on 1-D) in FP32 and FP64:
    True when every parameter and moment agrees bitwise after `steps` updates."""
    o = {"beta1": 0.9, "beta2": 0.95, "eps": 1e-8, "weight_decay": 0.1}
    gen = torch.Generator().manual_seed(seed)
    for dtype in (FP32, FP64):
        init = {"w": torch.randn(5, 7, generator=gen, dtype=dtype), "n": torch.randn(7, generator=gen, dtype=dtype)}
        mine = {k: v.clone() for k, v in init.items()}
        theirs = {k: torch.nn.Parameter(v.clone()) for k, v in init.items()}
        opt = torch.optim.AdamW([{"params": [theirs["w"]], "weight_decay": o["weight_decay"]},
                                 {"params": [theirs["n"]], "weight_decay": 0.0}],
                                lr=1e-3, betas=(o["beta1"], o["beta2"]), eps=o["eps"])
        state = {}
        for s in range(1, steps + 1):
            grads = {k: torch.randn(v.shape, generator=gen, dtype=dtype) for k, v in init.items()}
            lr = 1e-3 * (0.5 + s)
            for group in opt.param_groups:
                group["lr"] = lr
            for k, p in theirs.items():
                p.grad = grads[k].clone()
            opt.step()
            adamw_(mine, grads, state, s, lr, o)
        for k, p in theirs.items():
            st = opt.state[p]
            if not (torch.equal(p.detach(), mine[k]) and torch.equal(st["exp_avg"], state[k][0])
                    and torch.equal(st["exp_avg_sq"], state[k][1])):
                return False
    return True


# ---------------------------------------------------------------------------------------------------
# Training
# ---------------------------------------------------------------------------------------------------

class Trainer:
    def __init__(self, config, init, precision, bugs, from_step):
        self.config, self.m, self.o = config, config["model"], config["optim"]
        self.precision, self.bugs, self.from_step = precision, set(bugs), from_step
        if float(self.m.get("attention_dropout", 0)) > 0 or float(self.m.get("hidden_dropout", 0)) > 0:
            raise SystemExit("independent_candidate.py: dropout is not supported")
        if precision == "bf16" and "fp32_sites" in self.bugs:
            raise SystemExit("independent_candidate.py: fp32_sites is an FP64-mode bug")
        golden_norm = config["train"]["loss_normalization"]
        for norm in ("per_microbatch_mean", "global_token_mean"):
            if norm in self.bugs and norm == golden_norm:
                raise SystemExit(f"independent_candidate.py: the golden file already uses {norm}; "
                                 "inject the other normalisation")
        golden_convention = self.o.get("schedule_convention", "touchstone")
        for convention in ("megatron", "touchstone"):
            if f"schedule_{convention}" in self.bugs and convention == golden_convention:
                raise SystemExit(f"independent_candidate.py: the golden file already uses the {convention} "
                                 "schedule convention; inject the other one")
        if "tied_embedding_reduced_twice" in self.bugs and not self.m["tie_embeddings"]:
            raise SystemExit("independent_candidate.py: tied_embedding_reduced_twice needs tied embeddings")
        if ("cp2_token_count_not_reduced" in self.bugs
                and self.config["train"]["loss_normalization"] != "global_token_mean"):
            raise SystemExit("independent_candidate.py: cp2_token_count_not_reduced needs global_token_mean")
        shapes = parameter_shapes(self.m)
        if set(shapes) != set(init):
            raise SystemExit("independent_candidate.py: /params/init holds "
                             f"{sorted(set(init) ^ set(shapes))} against the config's parameter names")
        self.names = list(shapes)
        self.dtype = FP64 if precision == "fp64" else FP32
        # FP32 master weights in BF16 mode (the golden init is already FP32-representable there).
        self.params = {n: torch.from_numpy(np.asarray(init[n], dtype=np.float64)).to(self.dtype).clone()
                       for n in self.names}
        for n, p in self.params.items():
            if tuple(p.shape) != shapes[n]:
                raise SystemExit(f"independent_candidate.py: /params/init/{n} has shape {tuple(p.shape)}, "
                                 f"expected {shapes[n]}")
        self.state = {}

    def active(self, step):
        return self.bugs if step >= self.from_step else set()

    def step(self, step, batch):
        bugs = self.active(step)
        m, train, data = self.m, self.config["train"], self.config["data"]
        ar = Bf16() if self.precision == "bf16" else Fp64(fp32_sites="fp32_sites" in bugs)
        normalization = train["loss_normalization"]
        for norm in ("per_microbatch_mean", "global_token_mean"):
            if norm in bugs:
                normalization = norm
        masking = bool(data["document_masking"]) and "no_document_mask" not in bugs
        targets = buggy_targets(batch, data, bugs)
        B, T = targets.shape
        mbs = int(train["micro_batch_size"])
        num_micro = B // mbs
        total = int((targets != IGNORE).sum())
        positions = batch["position_ids"]
        window_positions = key_blocks = None
        if "cp2_chunks_not_load_balanced" in bugs:
            window_positions = cp2_slot_positions(T)
            positions = positions[:, window_positions]
        if "cp2_merge_without_lse" in bugs:
            key_blocks = [cp2_ranks(T) == r for r in (0, 1)]
        allowed = attention_allowed(batch["document_ids"], masking, window_positions)
        if "cp2_token_count_not_reduced" in bugs:
            # Each rank's count over the global batch (summed over micro-batches and dp, not over cp).
            labelled = targets != IGNORE
            rank_counts = [int(labelled[:, cp2_ranks(T) == r].sum()) for r in (0, 1)]
            total = rank_counts[0]

        leaves = {n: p.detach().clone().requires_grad_(True) for n, p in self.params.items()}
        loss, token_losses = 0.0, []
        for j in range(num_micro):  # gradient accumulation over consecutive micro-batches
            rows = slice(j * mbs, (j + 1) * mbs)
            logits = forward(ar, leaves, m, batch["tokens"][rows], positions[rows], allowed[rows],
                             "qkv_wrong_grouping" in bugs or "qkv_split_in_conversion" in bugs,
                             "zero3_not_regathered" in bugs, key_blocks)
            losses = token_cross_entropy(ar.logits_for_loss(logits), targets[rows])
            if normalization == "global_token_mean":
                weight = 1.0 / max(total, 1)
            else:
                weight = 1.0 / (num_micro * max(int((targets[rows] != IGNORE).sum()), 1))
            if "cp2_default_normalization" in bugs:
                micro_loss = (losses * cp2_rank_weights(targets[rows], num_micro).to(losses.dtype)).sum()
            elif "cp2_token_count_not_reduced" in bugs:
                weights = torch.tensor([1.0 / max(c, 1) for c in rank_counts], dtype=FP64)[cp2_ranks(T)]
                micro_loss = (losses * weights.to(losses.dtype)).sum()
            else:
                micro_loss = losses.sum() * weight
            # step_before_last_w: the last micro-batch's weight-gradient pass never reaches the step.
            kept = None
            if "step_before_last_w" in bugs and j == num_micro - 1:
                kept = {n: leaves[n].grad.detach().clone() for n in self.names
                        if not n.endswith("layernorm.weight") and leaves[n].grad is not None}
            micro_loss.backward()
            if kept is not None:
                for n, g in kept.items():
                    leaves[n].grad.copy_(g)
            loss += float(micro_loss)
            token_losses.append(losses.detach().to(FP64))

        grads = {n: leaves[n].grad.detach().clone() for n in self.names}
        if "grad_half" in bugs:
            for g in grads.values():
                g.div_(2)
        if "tied_embedding_reduced_twice" in bugs:
            # Two ranks hold e (input side) and o (output side); the first all-reduce gives both e + o,
            # the second 2 (e + o).
            grads["embedding.word_embeddings.weight"].mul_(2)
        recorded = {n: g.clone() for n, g in grads.items()}
        # torch.nn.utils.clip_grad_norm_'s arithmetic, in the master dtype.
        grad_norm = torch.norm(torch.stack([torch.norm(grads[n], 2.0) for n in self.names]), 2.0)
        clip = float(self.o["clip_grad"])
        coefficient = 1.0
        if clip > 0:
            coef = torch.clamp(clip / (grad_norm + 1e-6), max=1.0)
            coefficient = float(coef)
            if "clip_after_moments" not in bugs:
                for g in grads.values():
                    g.mul_(coef)
        convention = self.o.get("schedule_convention", "touchstone")
        for other in ("megatron", "touchstone"):
            if f"schedule_{other}" in bugs:
                convention = other
        lr = learning_rate(step, self.o, convention, B)
        with torch.no_grad():
            adamw_(self.params, grads, self.state, step, lr, self.o,
                   decay_all="wd_on_norms" in bugs,
                   bias_correction="no_bias_correction" not in bugs,
                   update_scale=coefficient if "clip_after_moments" in bugs else 1.0)
        return {"loss": loss, "num_loss_tokens": total, "token_losses": torch.cat(token_losses),
                "grads": recorded, "grad_norm": float(grad_norm), "lr": lr,
                "params": {n: self.params[n].clone() for n in self.names},
                "exp_avg": {n: self.state[n][0].clone() for n in self.names},
                "exp_avg_sq": {n: self.state[n][1].clone() for n in self.names}}


def cp2_ranks(T):
    """[T]: the cp rank of each window position at cp = 2 (chunks 0 and 3 on rank 0, 1 and 2 on rank 1)."""
    if T % 4:
        raise SystemExit("independent_candidate.py: the cp2 bugs need seq_length divisible by 4")
    chunk = torch.arange(T) // (T // 4)
    return torch.where((chunk == 0) | (chunk == 3), 0, 1)


def cp2_slot_positions(T):
    """[T]: slot i of contiguous halves (rank 0: slots 0..T/2-1) -> the load-balanced position of the
    same slot of the same rank (rank 0's rows are chunks 0 and 3, rank 1's chunks 1 and 2)."""
    positions, rank = torch.arange(T), cp2_ranks(T)
    return torch.cat([positions[rank == 0], positions[rank == 1]])


def cp2_rank_weights(targets, num_micro):
    """[mbs, T] weights of Megatron-LM's default normalisation under cp = 2: the window in 4 chunks,
    CP rank 0 holding chunks 0 and 3 and rank 1 chunks 1 and 2 (load balancing); each position
    weighted by 1 / (micro-batches x 2 ranks x its rank's loss tokens in the micro-batch, >= 1)."""
    rank = cp2_ranks(targets.shape[1])
    labelled = targets != IGNORE
    weights = torch.zeros(targets.shape, dtype=FP64)
    for r in (0, 1):
        count = int(labelled[:, rank == r].sum())
        weights[:, rank == r] = 1.0 / (num_micro * 2 * max(count, 1))
    return weights


def parse_bugs(values):
    bugs = []
    for value in values:
        for bug in value.split(","):
            bug = bug.strip()
            if not bug:
                continue
            if bug not in BUGS:
                raise SystemExit(f"independent_candidate.py: unknown bug {bug!r}; known: {', '.join(BUGS)}")
            bugs.append(bug)
    return bugs


def regroup_qkv(name, tensor, m):
    """A linear_qkv tensor whose rows are [all q heads; all k heads; all v heads] -> per KV group [its q
    heads; k; v] (what a correct converter makes of separate q/k/v projections)."""
    if not name.endswith("linear_qkv.weight"):
        return tensor
    NH, NKV = m["num_heads"], m["num_kv_heads"]
    D = m["hidden_size"] // NH
    G = NH // NKV
    rows = tensor.reshape(NH + 2 * NKV, D, -1)
    q, k, v = rows[:NH].reshape(NKV, G, D, -1), rows[NH:NH + NKV], rows[NH + NKV:]
    groups = [np.concatenate([q[g], k[g:g + 1], v[g:g + 1]]) for g in range(NKV)]
    return np.concatenate(groups).reshape(tensor.shape)


def run(golden_path, out_path, precision=None, bugs=(), from_step=1, steps=None, save_optimizer_state=False,
        verbose=False, initial_params=True):
    """Replays the golden file's steps with this trainer and writes the candidate file. Returns the
    list of per-step records."""
    torch.set_num_threads(1)
    with h5py.File(golden_path, "r") as golden:
        config = json.loads(golden.attrs["config"])
        tolerance_model = json.loads(golden.attrs.get("tolerance_model", "{}"))
        init = {name: ds[()] for name, ds in golden["params/init"].items()}
        recorded = len(golden["steps"])
        steps = recorded if steps is None else min(steps, recorded)
        batches = [{key: torch.from_numpy(golden["batch"][key][s].astype(np.int64))
                    for key in ("tokens", "targets", "position_ids", "document_ids")} for s in range(steps)]
    if precision is None:  # an envelope golden file stores FP64 values and names its precision
        bf16 = config.get("precision") == "bf16" or tolerance_model.get("precision") == "bf16"
        precision = "bf16" if bf16 else "fp64"
    trainer = Trainer(config, init, precision, list(bugs), from_step)
    store = np.float64 if precision == "fp64" else np.float32
    temporary = out_path + ".tmp"
    records = []
    with h5py.File(temporary, "w") as out:
        out.attrs["generator"] = GENERATOR
        out.attrs["candidate_precision"] = precision
        out.attrs["injected"] = ",".join(bugs)
        out.attrs["inject_from_step"] = np.int64(from_step)
        m = config["model"]
        # The qkv conversion mistake shows in everything written; the computation before it is the
        # wrong-grouping model's. Before --inject-from-step the conversion is right.
        convert = lambda step, n, t: (regroup_qkv(n, t, m) if "qkv_split_in_conversion" in bugs and step >= from_step
                                      else t)
        for n in trainer.names if initial_params else ():
            out.create_dataset(f"params/init/{n}", data=convert(1, n, trainer.params[n].numpy()).astype(store))
        for step, batch in enumerate(batches, start=1):
            r = trainer.step(step, batch)
            records.append(r)
            g = f"steps/{step}"
            out[f"{g}/loss"] = np.float64(r["loss"])
            out[f"{g}/num_loss_tokens"] = np.int64(r["num_loss_tokens"])
            out[f"{g}/token_losses"] = r["token_losses"].numpy()
            out[f"{g}/grad_norm"] = np.float64(r["grad_norm"])
            out[f"{g}/lr"] = np.float64(r["lr"])
            groups = ["grads", "params"] + (["exp_avg", "exp_avg_sq"] if save_optimizer_state else [])
            for group in groups:
                prefix = f"{g}/optimizer/{group}" if group.startswith("exp_avg") else f"{g}/{group}"
                for n in trainer.names:
                    out.create_dataset(f"{prefix}/{n}", data=convert(step, n, r[group][n].numpy()).astype(store))
            if verbose:
                print(f"step {step}: loss {r['loss']:.8f}, {r['num_loss_tokens']} loss tokens, "
                      f"grad norm {r['grad_norm']:.6e}, lr {r['lr']:.3e}")
    os.replace(temporary, out_path)
    return records


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("golden", help="golden file written by `touchstone golden`")
    parser.add_argument("--out", required=True, help="candidate file to write (HDF5, golden schema)")
    parser.add_argument("--precision", choices=("fp64", "bf16"), default=None,
                        help="arithmetic (default: bf16 when the golden file is a BF16 run or a BF16 "
                             "envelope, else fp64)")
    parser.add_argument("--steps", type=int, default=None, help="steps to run (default: all recorded)")
    parser.add_argument("--inject", action="append", default=[], metavar="BUG",
                        help="plant a known mistake (repeatable or comma-separated): " + ", ".join(BUGS))
    parser.add_argument("--inject-from-step", type=int, default=1, metavar="N",
                        help="the injected bugs are active in steps >= N only (default 1)")
    parser.add_argument("--save-optimizer-state", action="store_true",
                        help="also write steps/<s>/optimizer/exp_avg and exp_avg_sq")
    parser.add_argument("--no-initial-params", action="store_true",
                        help="do not write params/init (the step-1 anchor is then the golden file's)")
    args = parser.parse_args(argv)
    if args.inject_from_step < 1:
        parser.error("--inject-from-step must be >= 1")
    if args.steps is not None and args.steps < 1:
        parser.error("--steps must be >= 1")
    run(args.golden, args.out, args.precision, parse_bugs(args.inject), args.inject_from_step, args.steps,
        args.save_optimizer_state, verbose=True, initial_params=not args.no_initial_params)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    sys.dont_write_bytecode = True
    main()
