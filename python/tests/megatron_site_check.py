"""Checks each float32-site fix of touchstone.megatron numerically, fixed and unfixed, on one rank.

usage: PYTHONPATH=MEGATRON_CORE:python megatron_site_check.py GOLDEN.h5   (prints JSON)

Builds Megatron-Core's GPTModel of the golden config (tp 1) with every fix and runs
float32_sites.check_fixes on it (finalize_model_grads included); then, for each site, a model and
process without that one fix, whose check must raise RuntimeError. Run by test_megatron.py in a
process of its own, since a Megatron-Core version is chosen by PYTHONPATH.
"""

import json
import os
import sys

import torch

from touchstone.golden import GoldenFile
from touchstone.megatron import float32_sites, model as mmodel, run
from touchstone.megatron.cpu_shims import cpu_shims


def build(golden, sites):
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig

    config = mmodel.transformer_config(golden, 1, 1, torch.float64)
    model = mmodel.build_model(golden, config)
    if "norm" in sites:
        float32_sites.fix_norms(model)
    if "rope" in sites:
        float32_sites.fix_rope(model, float(golden.model["rope_theta"]))
    mmodel.load_golden_params(model, golden, 1, 0, 1, 0)
    ddp = DistributedDataParallel(config=config, module=model, ddp_config=DistributedDataParallelConfig(
        grad_reduce_in_fp32=False, overlap_grad_reduce=False, use_distributed_optimizer=False))
    return model, ddp


def optimizer_check(golden):
    """Which optimizer get_megatron_optimizer builds on the CPU, and two of its steps (with the
    OptimizerParamScheduler, which sets each group's rate and weight decay) against the contract's
    AdamW (docs/contract.md "Update") computed here in float64, parameter by parameter."""
    import megatron.core.optimizer as megatron_optimizer

    model, ddp = build(golden, float32_sites.SITES)
    optimizer = run._optimizer(golden, [ddp], torch.float64)
    scheduler = run._schedule(golden, optimizer)  # sets each group's lr and weight decay, as in a run
    inner = run.inner_optimizers(optimizer)
    o = golden.config["optim"]
    b1, b2, eps, wd = (float(o[k]) for k in ("beta1", "beta2", "eps", "weight_decay"))
    params = [p for p in ddp.parameters()]
    want = {id(p): p.detach().clone() for p in params}
    m = {id(p): torch.zeros_like(p) for p in params}
    v = {id(p): torch.zeros_like(p) for p in params}
    g = torch.Generator().manual_seed(3)
    worst = 0.0
    for step in (1, 2):
        lr = inner[0].param_groups[0]["lr"]
        for p in params:  # small enough that the norm stays below clip_grad: nothing is clipped
            grad = torch.randn(p.shape, dtype=torch.float64, generator=g) * 1e-4
            p.main_grad.copy_(grad)
            decay = wd if p.dim() >= 2 else 0.0
            k = id(p)
            m[k] = b1 * m[k] + (1 - b1) * grad
            v[k] = b2 * v[k] + (1 - b2) * grad * grad
            want[k] = want[k] * (1 - lr * decay) - lr * (m[k] / (1 - b1 ** step)) / (
                torch.sqrt(v[k] / (1 - b2 ** step)) + eps)
        success, norm, _ = optimizer.step()
        assert success and norm < float(o["clip_grad"]), norm
        scheduler.step(increment=int(golden.config["train"]["global_batch_size"]))
        for p in params:
            k = id(p)
            worst = max(worst, float((p.detach() - want[k]).abs().max() / want[k].abs().max()))
    return {"using_pytorch_optimizer": bool(megatron_optimizer.USING_PYTORCH_OPTIMIZER),
            "megatron": [type(optimizer).__name__] + [type(c).__name__ for c in
                                                       getattr(optimizer, "chained_optimizers", [])],
            "torch": sorted({type(i).__module__ + "." + type(i).__name__ for i in inner}),
            "max_relative_error": worst}


def main(golden_path):
    from megatron.core import parallel_state
    from megatron.core.distributed import finalize_model_grads
    from megatron.core.tensor_parallel.random import initialize_rng_tracker

    torch.distributed.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{run.free_port()}", rank=0,
                                         world_size=1)
    result = {"version": float32_sites.check_version(), "fixed": {}, "unfixed": {}}
    before = (torch.cuda.current_device, torch.cuda.synchronize, torch.cuda.current_stream,
              torch.Tensor.cuda, torch.Tensor.type)
    with cpu_shims():
        result["shims"] = {"cuda_device": torch.zeros(1, device="cuda").device.type,
                           "index_device": torch.ones(2, device=torch.cuda.current_device()).device.type,
                           "type": torch.zeros(1, dtype=torch.float64).type()}
    after = (torch.cuda.current_device, torch.cuda.synchronize, torch.cuda.current_stream,
             torch.Tensor.cuda, torch.Tensor.type)
    result["shims"]["undone"] = all(a is b for a, b in zip(before, after)) and \
        torch.zeros(1, dtype=torch.float64).type() == "torch.DoubleTensor"
    with cpu_shims(), GoldenFile(golden_path) as golden:
        parallel_state.initialize_model_parallel(1, 1)
        initialize_rng_tracker(inference_rng_tracker=True, force_reset=True)
        theta = float(golden.model["rope_theta"])
        checked = [s for s in float32_sites.SITES if s != "loss_func"]
        with float32_sites.process_fixes(float32_sites.SITES):
            model, ddp = build(golden, float32_sites.SITES)
            result["fixed"] = float32_sites.check_fixes(
                model, theta, checked, finalize=float32_sites.fp64_finalize_model_grads(finalize_model_grads),
                ddp_model=ddp)
        for site in checked:
            others = [s for s in float32_sites.SITES if s != site]
            with float32_sites.process_fixes(others):
                model, ddp = build(golden, others)
                try:
                    float32_sites.check_fixes(model, theta, [site], finalize=finalize_model_grads, ddp_model=ddp)
                    result["unfixed"][site] = None
                except RuntimeError as e:
                    result["unfixed"][site] = str(e)
        with float32_sites.process_fixes(float32_sites.SITES):
            result["optimizer"] = optimizer_check(golden)
        # loss_func: pretrain_gpt.py's casts the per-token losses to float32; ours keeps float64.
        losses = torch.rand(2, 5, dtype=torch.float64) * 7
        mask = torch.ones(2, 5, dtype=torch.float64)
        exact = float(losses.sum())
        for keep, key in ((False, "fixed"), (True, "unfixed")):
            loss, count, _ = run.loss_func(mask, losses, keep_float32=keep)
            result[key]["loss_func"] = {"dtype": str(loss.dtype), "error": abs(float(loss) - exact) / exact,
                                        "count": int(count)}
    torch.distributed.destroy_process_group()
    print(json.dumps(result))


if __name__ == "__main__":
    main(sys.argv[1])
