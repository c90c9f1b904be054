#!/usr/bin/env python3
"""Replay a golden file's steps in plain PyTorch and write a candidate for `touchstone diff`.

The plain-PyTorch recipe of docs/frameworks/pytorch.md in one runnable file, on the touchstone package
(python/touchstone). A run is comparable with a golden file when it
  1. starts from the golden initial weights (GoldenFile.init_param), loaded into parameters that carry
     the contract's names, so that no name mapping is needed when dumping;
  2. trains on the golden batches micro-batch by micro-batch in Megatron-LM's order
     (GoldenFile.micro_batches), each micro-batch's token-loss sum multiplied by its loss_weight (the
     golden loss normalisation), under the golden attention mask (touchstone.masks.attention_allowed);
  3. dumps what the golden file records, with touchstone.CandidateWriter: the objective, the
     loss-token count, the gradients before clipping, the gradient norm, the learning rate and the
     parameters after the update of every step.
The learning rate of every step is the one the golden file records (GoldenFile.expected(step).lr).
Nothing here is random: no dropout, no sampling, the optimizer is torch.optim.AdamW and clipping is
torch.nn.utils.clip_grad_norm_, exactly as a PyTorch training loop would use them.

Usage, from the repository root (or `pip install ./python` and leave out PYTHONPATH):
    PYTHONPATH=python python3 tools/examples/pytorch_candidate.py GOLDEN.h5 --out CANDIDATE.h5 \
        [--steps N] [--dtype float64|float32|bfloat16]
    touchstone diff GOLDEN.h5 CANDIDATE.h5

--inject BUG (repeatable) plants a known mistake; the tests of `touchstone diff` use it to check that
each one is caught and named:
    per_microbatch_mean   mean of micro-batch means instead of the golden loss normalisation
    no_document_mask      plain causal attention across documents
    positions_not_reset   RoPE positions 0..T-1 instead of the recorded (per-document) ones; with the
                          document mask on this changes nothing but rounding (RoPE depends only on
                          distances within a document), so it shows only together with
                          no_document_mask
    padding_in_loss       padding positions (and the one before them) trained to predict padding
    eos_rule_flipped      the data.eos_loss rule inverted (targets that are EOS untrained, or trained)
    qkv_wrong_grouping    linear_qkv rows read as [all q heads; all k heads; all v heads]
    drop_tp_shard         tp rank 1 of 2's rows of the last layer's linear_fc1 gradient zeroed
                          ([gate_1; up_1], Megatron-LM's per-rank layout)
    dp_double_division    every gradient divided by 2 once more (a second data-parallel average)

Needs torch, numpy and h5py (Debian: python3-torch, python3-numpy, python3-h5py).
"""

import argparse
import math
import sys

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

try:
    from touchstone import CandidateWriter, GoldenFile
    from touchstone.loss import token_losses
    from touchstone.masks import attention_allowed
except ModuleNotFoundError as error:
    if error.name != "touchstone":
        raise
    sys.exit("pytorch_candidate.py: the touchstone package is not importable: run it with PYTHONPATH=python "
             "from the repository root, or pip install ./python")

BUGS = ("per_microbatch_mean", "no_document_mask", "positions_not_reset", "padding_in_loss",
        "eos_rule_flipped", "qkv_wrong_grouping", "drop_tp_shard", "dp_double_division")


# ---------------------------------------------------------------------------------------------
# The model: module names chosen so that named_parameters() yields the contract's names
# (embedding.word_embeddings.weight, decoder.layers.{l}.self_attention.linear_qkv.weight, ...).
# ---------------------------------------------------------------------------------------------

class RMSNorm(nn.Module):
    def __init__(self, size, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x):
        return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + self.eps) * self.weight


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat([-x[..., half:], x[..., :half]], dim=-1)


class SelfAttention(nn.Module):
    def __init__(self, m, qkv_layout):
        super().__init__()
        self.NH, self.NKV, self.D = m["num_heads"], m["num_kv_heads"], m["hidden_size"] // m["num_heads"]
        self.theta, self.qkv_layout = m["rope_theta"], qkv_layout
        self.linear_qkv = nn.Linear(m["hidden_size"], (self.NH + 2 * self.NKV) * self.D, bias=False)
        self.linear_proj = nn.Linear(self.NH * self.D, m["hidden_size"], bias=False)

    def split(self, qkv):
        """[B, T, (NH+2NKV)D] -> q [B, NH, T, D], k and v [B, NKV, T, D]."""
        B, T, _ = qkv.shape
        NH, NKV, D = self.NH, self.NKV, self.D
        if self.qkv_layout == "grouped":  # the contract: per KV group, its G query heads, key, value
            groups = qkv.view(B, T, NKV, NH // NKV + 2, D)
            q = groups[:, :, :, :-2].reshape(B, T, NH, D)
            k, v = groups[:, :, :, -2], groups[:, :, :, -1]
        else:  # [all q; all k; all v]: a common layout elsewhere, wrong for these weights
            q = qkv[..., :NH * D].view(B, T, NH, D)
            k = qkv[..., NH * D:(NH + NKV) * D].view(B, T, NKV, D)
            v = qkv[..., (NH + NKV) * D:].view(B, T, NKV, D)
        return q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)

    def forward(self, h, positions, allowed):
        q, k, v = self.split(self.linear_qkv(h))
        inv_freq = self.theta ** (-2.0 * torch.arange(self.D // 2, dtype=torch.float64) / self.D)
        angles = positions.to(torch.float64)[..., None] * inv_freq                 # [B, T, D/2]
        angles = torch.cat([angles, angles], dim=-1)[:, None].to(h.dtype)          # [B, 1, T, D]
        q = q * angles.cos() + rotate_half(q) * angles.sin()
        k = k * angles.cos() + rotate_half(k) * angles.sin()
        G = self.NH // self.NKV
        k, v = k.repeat_interleave(G, dim=1), v.repeat_interleave(G, dim=1)
        scores = (q @ k.transpose(-1, -2)) / math.sqrt(self.D)
        probs = torch.softmax(scores.masked_fill(~allowed[:, None], float("-inf")), dim=-1)
        out = (probs @ v).transpose(1, 2).reshape(h.shape[0], h.shape[1], self.NH * self.D)
        return self.linear_proj(out)


class MLP(nn.Module):
    def __init__(self, m):
        super().__init__()
        self.F = m["ffn_hidden_size"]
        self.linear_fc1 = nn.Linear(m["hidden_size"], 2 * self.F, bias=False)   # rows: [gate; up]
        self.linear_fc2 = nn.Linear(self.F, m["hidden_size"], bias=False)

    def forward(self, h):
        gate, up = self.linear_fc1(h).split(self.F, dim=-1)
        return self.linear_fc2(F.silu(gate) * up)


class Layer(nn.Module):
    def __init__(self, m, qkv_layout):
        super().__init__()
        self.input_layernorm = RMSNorm(m["hidden_size"], m["norm_eps"])
        self.self_attention = SelfAttention(m, qkv_layout)
        self.pre_mlp_layernorm = RMSNorm(m["hidden_size"], m["norm_eps"])
        self.mlp = MLP(m)

    def forward(self, x, positions, allowed):
        x = x + self.self_attention(self.input_layernorm(x), positions, allowed)
        return x + self.mlp(self.pre_mlp_layernorm(x))


class Decoder(nn.Module):
    def __init__(self, m, qkv_layout):
        super().__init__()
        self.layers = nn.ModuleList(Layer(m, qkv_layout) for _ in range(m["num_layers"]))
        self.final_layernorm = RMSNorm(m["hidden_size"], m["norm_eps"])


class Embedding(nn.Module):
    def __init__(self, m):
        super().__init__()
        self.word_embeddings = nn.Embedding(m["vocab_size"], m["hidden_size"])


class Llama(nn.Module):
    def __init__(self, m, qkv_layout="grouped"):
        super().__init__()
        self.tied = m["tie_embeddings"]
        self.embedding = Embedding(m)
        self.decoder = Decoder(m, qkv_layout)
        if not self.tied:
            self.output_layer = nn.Linear(m["hidden_size"], m["vocab_size"], bias=False)

    def forward(self, tokens, positions, allowed):
        x = self.embedding.word_embeddings(tokens)
        for layer in self.decoder.layers:
            x = layer(x, positions, allowed)
        x = self.decoder.final_layernorm(x)
        weight = self.embedding.word_embeddings.weight if self.tied else self.output_layer.weight
        return x @ weight.t()


# ---------------------------------------------------------------------------------------------
# Data rules applied to the golden batch (only the injected bugs change anything here).
# ---------------------------------------------------------------------------------------------

def inject_targets(batch, data, bugs):
    """The targets [B, T] a buggy data pipeline would produce from the golden batch (a touchstone.Batch)."""
    tokens, docs = torch.from_numpy(batch.tokens), torch.from_numpy(batch.document_ids)
    targets = torch.from_numpy(batch.targets).clone()
    next_tokens = torch.cat([tokens[:, 1:], torch.full_like(tokens[:, :1], data["pad_token"])], dim=1)
    next_docs = torch.cat([docs[:, 1:], docs[:, -1:]], dim=1)
    if "padding_in_loss" in bugs:  # padding (and the position before it) not masked out
        padding = (targets == -100) & ((docs == -1) | (next_docs == -1))
        targets[padding] = next_tokens[padding]
    if "eos_rule_flipped" in bugs:
        eos = data["eos_token"]
        if data["eos_loss"]:
            targets[targets == eos] = -100
        else:
            inside = (targets == -100) & (docs != -1) & (next_docs == docs) & (next_tokens == eos)
            inside[:, -1] = False
            targets[inside] = eos
    return targets


def loss_weight(normalization, count, total, num_micro):
    """What a micro-batch's token-loss sum is multiplied by under `normalization` (the golden file's
    MicroBatch.loss_weight rule), for targets that are not the golden ones."""
    if normalization == "global_token_mean":
        return 1.0 / max(total, 1)
    return 1.0 / (max(count, 1) * num_micro)  # each micro-batch's own mean, averaged over the micro-batches


# ---------------------------------------------------------------------------------------------
# Training steps and the dump.
# ---------------------------------------------------------------------------------------------

def drop_tp_shard(grad, tp=2, rank=1):
    """Zero tp rank `rank`'s rows of a linear_fc1 gradient: its gate rows and its up rows."""
    ffn = grad.shape[0] // 2
    local = ffn // tp
    grad[rank * local:(rank + 1) * local] = 0
    grad[ffn + rank * local:ffn + (rank + 1) * local] = 0


def forward_backward(model, golden, step, bugs, dtype):
    """Step `step`'s forward and backward, micro-batch by micro-batch, gradients accumulated in the
    parameters. Returns (objective, loss-token count, token losses [B, T])."""
    data = golden.config["data"]
    normalization = "per_microbatch_mean" if "per_microbatch_mean" in bugs else golden.loss_normalization
    masking = golden.document_masking and "no_document_mask" not in bugs
    batch = golden.batch(step)
    targets = inject_targets(batch, data, bugs)
    # The golden weights whenever the objective is the golden one; recomputed for a planted mistake.
    golden_objective = normalization == golden.loss_normalization and \
        torch.equal(targets, torch.from_numpy(batch.targets))
    micro_batches = golden.micro_batches(step)
    total_tokens = int((targets != -100).sum())

    loss, losses = 0.0, []
    for micro in micro_batches:  # gradient accumulation, as a production loop does it
        rows = slice(micro.rows.start, micro.rows.stop)
        mbs, T = micro.tokens.shape
        positions = torch.arange(T).expand(mbs, T) if "positions_not_reset" in bugs else \
            torch.from_numpy(micro.position_ids)
        allowed = torch.from_numpy(attention_allowed(micro.document_ids, masking))
        # BF16 as mixed precision: FP32 master weights and gradients, BF16 matrix products (autocast),
        # the cross entropy on FP32 logits.
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype == torch.bfloat16):
            logits = model(torch.from_numpy(micro.tokens), positions, allowed)
        per_token = token_losses(logits.float() if dtype == torch.bfloat16 else logits, targets[rows])
        weight = micro.loss_weight if golden_objective else \
            loss_weight(normalization, int((targets[rows] != -100).sum()), total_tokens, len(micro_batches))
        micro_loss = per_token.sum() * weight
        micro_loss.backward()
        loss += float(micro_loss)
        losses.append(per_token.detach().double())
    return loss, total_tokens, torch.cat(losses)


def run(golden, out, model, optimizer, steps, bugs, dtype):
    """Trains `steps` and writes each to `out`: the gradients before clipping, then the update."""
    named = dict(model.named_parameters())
    clip = golden.config["optim"]["clip_grad"]
    for step in steps:
        optimizer.zero_grad(set_to_none=False)
        loss, num_loss_tokens, losses = forward_backward(model, golden, step, bugs, dtype)
        if "dp_double_division" in bugs:
            for p in named.values():
                p.grad /= 2
        if "drop_tp_shard" in bugs:
            drop_tp_shard(named[f"decoder.layers.{golden.model['num_layers'] - 1}.mlp.linear_fc1.weight"].grad)
        out.write_step(step, loss=loss, num_loss_tokens=num_loss_tokens, token_losses=losses,
                       grads=((name, p.grad) for name, p in named.items()))   # before clipping
        grad_norm = float(torch.nn.utils.clip_grad_norm_(model.parameters(), clip)) if clip > 0 else \
            math.sqrt(sum(float((p.grad.double() ** 2).sum()) for p in named.values()))
        lr = golden.expected(step).lr  # the golden schedule's rate for update `step`
        for group in optimizer.param_groups:
            group["lr"] = lr
        optimizer.step()
        out.write_step(step, grad_norm=grad_norm, lr=lr, params=model.named_parameters())
        print(f"step {step}: loss {loss:.6f}, {num_loss_tokens} loss tokens, grad norm {grad_norm:.4e}")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("golden", help="golden file written by `touchstone golden`")
    parser.add_argument("--out", required=True, help="candidate file to write (HDF5, golden schema)")
    parser.add_argument("--steps", type=int, default=None, help="steps to run (default: all recorded)")
    parser.add_argument("--dtype", choices=("float64", "float32", "bfloat16"), default="float64",
                        help="compute precision; bfloat16 is mixed precision (FP32 weights and gradients, "
                             "BF16 matrix products under autocast)")
    parser.add_argument("--inject", action="append", default=[], choices=BUGS, metavar="BUG",
                        help="plant a known mistake (repeatable): " + ", ".join(BUGS))
    args = parser.parse_args()
    dtype = getattr(torch, args.dtype)
    store = torch.float64 if dtype == torch.float64 else torch.float32  # HDF5 has no bfloat16
    torch.manual_seed(0)
    torch.use_deterministic_algorithms(True)

    try:
        golden = GoldenFile(args.golden)
    except ValueError as error:
        sys.exit(f"pytorch_candidate.py: {error}")
    with golden:
        recorded = golden.steps
        steps = recorded[:max(0, min(args.steps or len(recorded), len(recorded)))]
        model = Llama(golden.model, "separate" if "qkv_wrong_grouping" in args.inject else "grouped").to(store)
        with torch.no_grad():
            for name, p in model.named_parameters():
                p.copy_(torch.from_numpy(golden.init_param(name)))  # a ValueError: not the contract's names
        o = golden.config["optim"]
        decay = [p for p in model.parameters() if p.dim() >= 2]
        no_decay = [p for p in model.parameters() if p.dim() < 2]
        optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": o["weight_decay"]},
                                       {"params": no_decay, "weight_decay": 0.0}],
                                      lr=o["lr"], betas=(o["beta1"], o["beta2"]), eps=o["eps"])
        generator = f"pytorch_candidate.py (torch {torch.__version__}, {args.dtype}" + \
            (f", injected: {' '.join(args.inject)})" if args.inject else ")")
        try:
            out = CandidateWriter(args.out, golden=golden, generator=generator,
                                  dtype=np.float64 if store == torch.float64 else np.float32)
        except ValueError as error:  # a missing directory, or a path that is not a regular file
            sys.exit(f"pytorch_candidate.py: {error}")
        with out:
            out.write_init(model.named_parameters())
            run(golden, out, model, optimizer, steps, args.inject, dtype)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
