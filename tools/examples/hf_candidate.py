#!/usr/bin/env python3
"""Replay a golden file with Hugging Face transformers' LlamaForCausalLM and write a candidate for
`touchstone diff` (docs/frameworks/huggingface.md explains each trap it avoids).

usage: PYTHONPATH=python hf_candidate.py GOLDEN.h5 --out CANDIDATE.h5 [--steps N] [--bf16]"""
import argparse
import contextlib

import torch
from transformers import LlamaForCausalLM

from touchstone import CandidateWriter, GoldenFile, hf_attention_mask
from touchstone.hf import exact_fp64, from_hf_state_dict, hf_grads, llama_config, load_golden_into
from touchstone.loss import micro_batch_loss


def load_model(golden, dtype):
    model = LlamaForCausalLM(llama_config(golden.config)).to(dtype)
    load_golden_into(model, golden)  # HF names; linear_qkv split per KV group; linear_fc1 = [gate; up]
    return exact_fp64(model) if dtype == torch.float64 else model  # no float32 RoPE, RMSNorm, softmax


def attention_mask(micro, golden, dtype):  # additive: HF adds a 4-D mask to the scores as given
    return hf_attention_mask(micro.document_ids, golden.document_masking, dtype)


def micro_loss(model, inputs, micro):  # from the logits: the golden targets are already shifted
    logits = model(**inputs).logits
    return micro_batch_loss(logits.float() if logits.dtype == torch.bfloat16 else logits, micro)[0]


def run(golden, out_path, steps=None, bf16=False):  # bf16: FP32 master weights, BF16 autocast
    dtype, o = torch.float32 if bf16 else torch.float64, golden.config["optim"]
    model = load_model(golden, dtype)
    groups = [{"params": [p for p in model.parameters() if p.dim() >= 2], "weight_decay": o["weight_decay"]},
              {"params": [p for p in model.parameters() if p.dim() < 2], "weight_decay": 0.0}]
    optimizer = torch.optim.AdamW(groups, lr=o["lr"], betas=(o["beta1"], o["beta2"]), eps=o["eps"])
    with CandidateWriter(out_path, golden=golden, generator="hf_candidate.py") as out:
        out.write_init(from_hf_state_dict(model.state_dict(), golden.model))
        for step in golden.steps[:steps]:
            optimizer.zero_grad(set_to_none=False)
            loss = 0.0
            for micro in golden.micro_batches(step):  # Megatron-LM's order
                inputs = dict(input_ids=torch.from_numpy(micro.tokens), attention_mask=attention_mask(
                    micro, golden, dtype), position_ids=torch.from_numpy(micro.position_ids))
                with torch.autocast("cpu", dtype=torch.bfloat16) if bf16 else contextlib.nullcontext():
                    share = micro_loss(model, inputs, micro)
                share.backward()
                loss += float(share.detach())  # detached: a scalar of a tensor with grad warns on torch 2.x
            expected = golden.expected(step)  # for the learning rate of the golden schedule only
            out.write_step(step, loss=loss, num_loss_tokens=golden.batch(step).num_loss_tokens,
                           grads=from_hf_state_dict(hf_grads(model), golden.model))  # before clipping
            norm = torch.nn.utils.clip_grad_norm_(model.parameters(), o["clip_grad"] or float("inf"))
            for group in optimizer.param_groups:
                group["lr"] = expected.lr
            optimizer.step()
            out.write_step(step, grad_norm=float(norm), lr=expected.lr,
                           params=from_hf_state_dict(model.state_dict(), golden.model))
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
