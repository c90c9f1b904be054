#!/usr/bin/env python3
"""Replay a golden file with torchtitan 0.3.0's own Llama3Model and write a candidate for `touchstone diff`
(docs/frameworks/torchtitan.md explains each conversion: pair-order q/k rows, the float64 RoPE,
`.double()`, the document-mask attention).

usage: PYTHONPATH=python torchtitan_candidate.py GOLDEN.h5 --out CANDIDATE.h5 [--steps N] [--bf16]"""
import argparse
import contextlib

import torch

from touchstone import CandidateWriter, GoldenFile
from touchstone.loss import micro_batch_loss
from touchstone.torchtitan import (build_model, document_mask, exact_fp64, from_titan_state,
                                   install_document_attention, load_golden_into, titan_grads)


def load_model(golden, dtype):
    model = build_model(golden)  # float32
    install_document_attention(model)  # none of torchtitan's attention trains on a CPU with a document mask
    if dtype == torch.float64:
        model.double()  # not .to(torch.float64): that casts the complex RoPE cache to a real tensor
        exact_fp64(model, golden.model["rope_theta"])  # ComplexRoPE computes in float32
    load_golden_into(model, golden)  # after the cast; q/k rows of every head in torchtitan's pair order
    return model


def micro_loss(model, micro, golden):  # from the logits: the golden targets are already shifted
    logits = model(torch.from_numpy(micro.tokens), torch.from_numpy(micro.position_ids),
                   attention_masks=document_mask(micro, golden))
    return micro_batch_loss(logits.float() if logits.dtype == torch.bfloat16 else logits, micro)[0]


def run(golden, out_path, steps=None, bf16=False):  # bf16: FP32 master weights, BF16 autocast
    dtype, o = torch.float32 if bf16 else torch.float64, golden.config["optim"]
    model = load_model(golden, dtype)
    groups = [{"params": [p for p in model.parameters() if p.dim() >= 2], "weight_decay": o["weight_decay"]},
              {"params": [p for p in model.parameters() if p.dim() < 2], "weight_decay": 0.0}]
    optimizer = torch.optim.AdamW(groups, lr=o["lr"], betas=(o["beta1"], o["beta2"]), eps=o["eps"])
    with CandidateWriter(out_path, golden=golden, generator="torchtitan_candidate.py") as out:
        out.write_init(from_titan_state(dict(model.named_parameters()), golden.model))
        for step in golden.steps[:steps]:
            optimizer.zero_grad(set_to_none=False)
            loss = 0.0
            for micro in golden.micro_batches(step):  # Megatron-LM's order
                with torch.autocast("cpu", dtype=torch.bfloat16) if bf16 else contextlib.nullcontext():
                    share = micro_loss(model, micro, golden)
                share.backward()
                loss += float(share.detach())
            expected = golden.expected(step)  # for the learning rate of the golden schedule only
            out.write_step(step, loss=loss, num_loss_tokens=golden.batch(step).num_loss_tokens,
                           grads=from_titan_state(titan_grads(model), golden.model))  # before clipping
            norm = torch.nn.utils.clip_grad_norm_(model.parameters(), o["clip_grad"] or float("inf"))
            for group in optimizer.param_groups:
                group["lr"] = expected.lr
            optimizer.step()
            out.write_step(step, grad_norm=float(norm), lr=expected.lr,
                           params=from_titan_state(dict(model.named_parameters()), golden.model))
            print(f"step {step}: loss {loss:.6f}, grad norm {float(norm):.4e}", flush=True)


if __name__ == "__main__":
    cli = argparse.ArgumentParser(description=__doc__)
    cli.add_argument("golden"), cli.add_argument("--out", required=True)
    cli.add_argument("--steps", type=int), cli.add_argument("--bf16", action="store_true")
    args = cli.parse_args()
    torch.use_deterministic_algorithms(True)
    with GoldenFile(args.golden) as golden:
        run(golden, args.out, args.steps, args.bf16)
    print(f"wrote {args.out}")
