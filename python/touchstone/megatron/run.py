"""Trains Megatron-Core's GPTModel on a golden file's batches and writes the candidate: `launch(...)`.

One process per rank (gloo on 127.0.0.1, a free port; `launch` spawns them, `launch_jobs` runs several
candidates of one world size in one set of ranks, one import of Megatron-Core for all), each running
`train_rank`:

1. Megatron-Core's process groups (`parallel_state.initialize_model_parallel(tp, pp)`; dp is what
   remains), its RNG tracker without dropout (`initialize_rng_tracker(inference_rng_tracker=True)`).
2. The model of model.py holding /params/init, the float32 sites fixed (float32_sites.py), wrapped in
   Megatron-Core's `DistributedDataParallel` (gradient buffer in the parameters' dtype, no overlap).
   A golden file with a BF16 envelope runs as Megatron-LM's --bf16: `Float16Module`, FP32 main
   gradients, FP32 main parameters holding /params/init, no float32 site fixed. With vp > 1 virtual
   stages, one model chunk per virtual stage (interleaved 1F1B), each written as a shard stage.
3. Megatron-Core's optimizer from `get_megatron_optimizer` (`--optimizer adam`, decoupled weight
   decay, no weight decay on 1-D tensors) and its `OptimizerParamScheduler` (cosine, warm-up, iteration
   counts times the global batch as Megatron-LM's `--lr-*-iters` make them). Without Transformer
   Engine and Apex, Megatron-Core takes `torch.optim.AdamW` (its `USING_PYTORCH_OPTIMIZER` branch:
   `adam_cls = torch.optim.AdamW if config.decoupled_weight_decay`), which is the contract's AdamW.
4. Every step as Megatron-LM's `train_step` does it: `zero_grad_buffer`, `optimizer.zero_grad`, the
   golden micro-batches of this dp rank (Megatron-LM's order) through `get_forward_backward_func()`
   with `forward_step` and `loss_func` as in pretrain_gpt.py, `finalize_model_grads` (dp all-reduce,
   tied-embedding all-reduce, 1/num_tokens of `--calculate-per-token-loss`) called by the schedule,
   `optimizer.step()`, then `opt_param_scheduler.step(increment=global batch)`.

The candidate is per-rank shards (docs/diffing.md "per-rank shards"): `rank_tp{t}_pp{p}.h5` written
with `CandidateWriter` by data-parallel rank 0 of every (tp, pp), and `shards.json`. Each rank writes
what it holds, so nothing is gathered, and the shards are put together by Touchstone's own
`parallel/tensor/sharding.h`, not by code of this package: a layout mistake here cannot be undone by
the same mistake in a gather. Gradients are the DDP buffer's `main_grad` after `finalize_model_grads`
and before clipping (what Megatron-LM's `--save-wgrads-interval` dumps); with tied embeddings and
pp > 1 both copies hold the sum (`tied_embedding_grads: "summed"`). The scalars (loss, token count,
gradient norm, learning rate) are in the last stage's tp rank 0 file.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import sys
from functools import partial
from typing import Any, Dict, Iterable, List, Optional, Sequence

import numpy as np
import torch

from touchstone.candidate import CandidateWriter
from touchstone.golden import IGNORE_INDEX, GoldenFile, MicroBatch
from touchstone.masks import attention_allowed
from touchstone.megatron import float32_sites, model as mmodel
from touchstone.megatron.cpu_shims import cpu_shims


def megatron_batch(micro: MicroBatch, document_masking: bool) -> Dict[str, torch.Tensor]:
    """What pretrain_gpt.py's get_batch returns for a golden micro-batch.

    labels are the golden targets (already shifted), a target of -100 being label 0 with loss_mask 0
    (Megatron-Core's cross entropy has no ignore index); attention_mask is bool [b, 1, s, s], True
    where attending is NOT allowed (Megatron-Core's convention), causal and per document.
    """
    targets = torch.from_numpy(micro.targets)
    allowed = torch.from_numpy(attention_allowed(micro.document_ids, document_masking))
    return {
        "tokens": torch.from_numpy(micro.tokens),
        "labels": torch.where(targets == IGNORE_INDEX, torch.zeros_like(targets), targets),
        "loss_mask": (targets != IGNORE_INDEX).to(torch.float64),
        "attention_mask": ~allowed[:, None, :, :],
        "position_ids": torch.from_numpy(micro.position_ids),
    }


def loss_func(loss_mask: torch.Tensor, output_tensor: torch.Tensor, keep_float32: bool = False):
    """pretrain_gpt.py's loss_func: (loss sum, loss-token count, {'lm loss': [sum, count]}).

    Megatron-LM takes `output_tensor.view(-1).float()`; in float64 that is the `loss_func` float32
    site, kept only with `keep_float32`. The schedule divides by the count and the number of
    micro-batches unless `calculate_per_token_loss` (per_microbatch_mean: Megatron-LM's default).
    """
    losses = output_tensor.view(-1)
    mask = loss_mask.view(-1)
    if keep_float32:
        losses, mask = losses.float(), mask.float()
    else:
        mask = mask.to(losses.dtype)
    loss = torch.sum(losses * mask)
    num_tokens = mask.sum().clone().detach().to(torch.int)
    reporting = torch.cat([loss.clone().detach().view(1), num_tokens.view(1).to(loss.dtype)])
    return loss, num_tokens, {"lm loss": reporting}


def forward_step(data_iterator: Any, model: Any, keep_float32_loss: bool = False):
    """pretrain_gpt.py's forward_step: the model's per-token losses and the loss function."""
    batch = next(data_iterator)
    output_tensor = model(batch["tokens"], batch["position_ids"], batch["attention_mask"],
                          labels=batch["labels"])
    return output_tensor, partial(loss_func, batch["loss_mask"], keep_float32=keep_float32_loss)


def replay_precision(golden: GoldenFile) -> str:
    """"bf16" for a golden file made with --set precision=bf16 --envelope (FP64 values, a BF16
    tolerance envelope: docs/precision.md), else the golden file's precision."""
    model = golden.tolerance_model
    if model.get("kind") == "envelope":
        return str(model.get("precision"))
    return golden.precision


def check_golden(golden: GoldenFile, tp: int, pp: int, dp: int = 1, vp: int = 1) -> None:
    """ValueError (one line) for a golden file this module cannot replay at tp x pp x dp (vp virtual
    stages per pipeline stage)."""
    precision = replay_precision(golden)
    if golden.precision != "fp64" or precision not in ("fp64", "bf16"):
        raise ValueError(f"{golden.path}: precision {golden.precision} (envelope {precision}); FP64 golden "
                         "files and BF16 envelopes (--set precision=bf16 --envelope) are replayed")
    convention = golden.config["optim"].get("schedule_convention")
    if convention != "megatron":
        raise ValueError(f"{golden.path}: optim.schedule_convention is {convention}; make the golden file "
                         "with --set optim.schedule_convention=megatron")
    mmodel.check_layout(golden, tp, pp * vp)
    gbs, mbs = int(golden.config["train"]["global_batch_size"]), golden.micro_batch_size
    if gbs % (mbs * dp):
        raise ValueError(f"{golden.path}: train.global_batch_size {gbs} is not a multiple of "
                         f"train.micro_batch_size {mbs} x dp {dp}")


def _schedule(golden: GoldenFile, optimizer: Any) -> Any:
    from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler

    o, gbs = golden.config["optim"], int(golden.config["train"]["global_batch_size"])
    return OptimizerParamScheduler(
        optimizer, init_lr=float(o["warmup_init"]), max_lr=float(o["lr"]), min_lr=float(o["min_lr"]),
        lr_warmup_steps=int(o["warmup_steps"]) * gbs, lr_decay_steps=int(o["decay_steps"]) * gbs,
        lr_decay_style="cosine", start_wd=float(o["weight_decay"]), end_wd=float(o["weight_decay"]),
        wd_incr_steps=int(golden.config["train"]["steps"]) * gbs, wd_incr_style="constant")


def _optimizer(golden: GoldenFile, ddp_models: List[Any], dtype: torch.dtype) -> Any:
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer

    o = golden.config["optim"]
    config = OptimizerConfig(
        optimizer="adam", lr=float(o["lr"]), min_lr=float(o["min_lr"]), weight_decay=float(o["weight_decay"]),
        adam_beta1=float(o["beta1"]), adam_beta2=float(o["beta2"]), adam_eps=float(o["eps"]),
        clip_grad=float(o["clip_grad"]), bf16=dtype == torch.bfloat16, fp16=False, params_dtype=dtype,
        use_distributed_optimizer=False, decoupled_weight_decay=True)
    return get_megatron_optimizer(config, ddp_models)


def inner_optimizers(optimizer: Any) -> List[torch.optim.Optimizer]:
    """The torch optimizers inside Megatron-Core's (ChainedOptimizer or FP32Optimizer)."""
    chained = getattr(optimizer, "chained_optimizers", [optimizer])
    return [o.optimizer for o in chained if getattr(o, "optimizer", None) is not None]


def train_rank(rank: int, world: int, port: int, jobs: Sequence[Dict[str, Any]]) -> None:
    """One rank of the runs `jobs` (see the module docstring), one after the other in this process.

    Each job is {golden, out, tp, pp, steps, sites} with tp x pp x dp = world; between jobs
    Megatron-Core's process groups are destroyed, so one import of Megatron-Core serves them all.
    """
    from megatron.core import parallel_state

    torch.set_num_threads(1)
    torch.distributed.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                                         world_size=world)
    try:
        for job in jobs:
            try:
                with cpu_shims(), GoldenFile(job["golden"]) as golden, (
                        float32_sites.process_fixes(job["sites"]) if replay_precision(golden) == "fp64"
                        else contextlib.nullcontext()):  # BF16 runs production's arithmetic as it is
                    _train(golden, job["out"], job["tp"], job["pp"], job["steps"], list(job["sites"]),
                           job["set_tp_attributes"], job["vp"])
            finally:
                parallel_state.destroy_model_parallel()
    finally:
        torch.distributed.destroy_process_group()


def _train(golden: GoldenFile, out_dir: str, tp: int, pp: int, steps: Optional[int], sites: List[str],
           set_tp_attributes: bool = True, vp: int = 1) -> None:
    from megatron.core import parallel_state
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from megatron.core.distributed import finalize_model_grads
    from megatron.core.pipeline_parallel import get_forward_backward_func
    from megatron.core.tensor_parallel.random import initialize_rng_tracker
    from megatron.core.transformer.module import Float16Module

    version = float32_sites.check_version()
    # BF16 as Megatron-LM's --bf16 --accumulate-allreduce-grads-in-fp32 runs it: Float16Module with
    # BF16 parameters, FP32 main gradients in the DDP buffer, Float16OptimizerWithFloat16Params with
    # FP32 main parameters; none of the float32 sites is fixed (they are production's arithmetic).
    bf16 = replay_precision(golden) == "bf16"
    dtype = torch.bfloat16 if bf16 else torch.float64
    if bf16:
        sites = []
    parallel_state.initialize_model_parallel(tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp,
                                             virtual_pipeline_model_parallel_size=vp if vp > 1 else None)
    initialize_rng_tracker(inference_rng_tracker=True, force_reset=True)
    tp_rank = parallel_state.get_tensor_model_parallel_rank()
    stage = parallel_state.get_pipeline_model_parallel_rank()
    dp = parallel_state.get_data_parallel_world_size()
    dp_rank = parallel_state.get_data_parallel_rank()
    last = parallel_state.is_pipeline_last_stage()

    config = mmodel.transformer_config(golden, tp, pp, dtype, vp)
    # Model chunk c of stage s is virtual stage c x pp + s (Megatron-Core's interleaving); without
    # virtual stages there is one chunk, the stage. Golden layer numbers count over virtual stages.
    vstages = [(c, c * pp + stage) for c in range(vp)]
    models = [mmodel.build_model(golden, config, c if vp > 1 else None) for c, _ in vstages]
    theta = float(golden.model["rope_theta"])
    for model, (_, vstage) in zip(models, vstages):
        if "norm" in sites:
            float32_sites.fix_norms(model)
        if "rope" in sites and getattr(model, "rotary_pos_emb", None) is not None:
            float32_sites.fix_rope(model, theta)
        if tp > 1 and version == "0.16.1" and set_tp_attributes:
            marked = mmodel.set_tensor_parallel_attributes(model)
            if marked and torch.distributed.get_rank() == 0:
                print(f"megatron.core 0.16.1: set the tensor-parallel attributes of {marked} parameters itself "
                      "(0.16.1 leaves them unset under use_cpu_initialization and perform_initialization=False)",
                      file=sys.stderr)
        mmodel.load_golden_params(model, golden, tp, tp_rank, pp * vp, vstage)
        if not bf16:
            float32_sites.check_fixes(model, theta, [s for s in sites if s != "loss_func"],
                                      tp_group=parallel_state.get_tensor_model_parallel_group())

    finalize = finalize_model_grads
    if "num_tokens" in sites:
        finalize = float32_sites.fp64_finalize_model_grads(finalize_model_grads)
    config.finalize_model_grads_func = finalize
    ddp_config = DistributedDataParallelConfig(grad_reduce_in_fp32=bf16, overlap_grad_reduce=False,
                                               use_distributed_optimizer=False)
    # Float16Module also casts the last stage's output (the per-token losses) to FP32, as in production;
    # chunks after the first get no buckets of their own, as Megatron-LM's get_model builds them.
    ddp_models = [DistributedDataParallel(config=config, ddp_config=ddp_config,
                                          module=Float16Module(config, model) if bf16 else model,
                                          disable_bucketing=c > 0)
                  for c, model in enumerate(models)]
    optimizer = _optimizer(golden, ddp_models, dtype)
    if bf16:
        for model, (_, vstage) in zip(models, vstages):
            mmodel.load_golden_params(model, golden, tp, tp_rank, pp * vp, vstage, attr="main_param")
            for _, param in model.named_parameters():
                if param.main_grad.dtype != torch.float32 or param.main_param.dtype != torch.float32:
                    raise RuntimeError(f"BF16 run: main gradient {param.main_grad.dtype}, main parameter "
                                       f"{param.main_param.dtype}; both must be float32")
    scheduler = _schedule(golden, optimizer)
    forward_backward = get_forward_backward_func()
    gbs, mbs = int(golden.config["train"]["global_batch_size"]), golden.micro_batch_size
    num_micro = gbs // (mbs * dp)
    T = int(golden.model["seq_length"])

    # The generator names the schedule Megatron-Core chose (1F1B at pp > 1:
    # forward_backward_pipelining_without_interleaving; with virtual stages ..._with_interleaving).
    generator = f"touchstone.megatron (megatron.core {version}, {forward_backward.__name__})"
    # In BF16 the updated parameters are the FP32 main parameters (the optimizer's master weights,
    # what the golden file's envelope judges: docs/precision.md), not the BF16 copies the passes use.
    weights = "main_param" if bf16 else "data"
    # One file per virtual stage, named by it: the shards hold pp x vp stages of contiguous layers,
    # and Touchstone's sharding puts them back (docs/diffing.md "per-rank shards").
    writers = [CandidateWriter(os.path.join(out_dir, f"rank_tp{tp_rank}_pp{vstage}.h5"), generator=generator,
                               dtype=np.float32 if bf16 else np.float64) for _, vstage in vstages] \
        if dp_rank == 0 else []
    with contextlib.ExitStack() as stack:
        for writer in writers:
            stack.enter_context(writer)
        for writer, model in zip(writers, models):
            writer.write_init(mmodel.stage_params(model, weights))
        for step in golden.steps[:steps]:
            micros = golden.micro_batches(step, dp=dp, dp_rank=dp_rank)
            batches = [megatron_batch(m, golden.document_masking) for m in micros]
            # Every chunk reads the micro-batches (the schedule takes one iterator per chunk).
            data = [iter(batches) for _ in models] if vp > 1 else iter(batches)
            for ddp_model in ddp_models:
                ddp_model.zero_grad_buffer()
            optimizer.zero_grad()
            losses = forward_backward(
                forward_step_func=partial(forward_step, keep_float32_loss=bf16 or "loss_func" not in sites),
                data_iterator=data, model=ddp_models, num_microbatches=num_micro, seq_length=T,
                micro_batch_size=mbs, decoder_seq_length=T, forward_only=False)
            for writer, model in zip(writers, models):  # the gradients before clipping (the step clips them)
                writer.write_step(step, grads=mmodel.stage_params(model, "main_grad"))
            lr = inner_optimizers(optimizer)[0].param_groups[0]["lr"]
            success, grad_norm, _ = optimizer.step()
            if not success:
                raise RuntimeError(f"step {step}: Megatron-Core's optimizer skipped the update")
            scheduler.step(increment=gbs)
            scalars: Dict[str, Any] = {}
            if last:
                scalars = _loss(losses, golden, num_micro, dp)
                scalars.update(grad_norm=float(grad_norm), lr=float(lr))
            for c, (writer, model) in enumerate(zip(writers, models)):
                writer.write_step(step, params=mmodel.stage_params(model, weights),
                                  **(scalars if tp_rank == 0 and c == vp - 1 else {}))
    torch.distributed.barrier()
    if torch.distributed.get_rank() == 0:
        stages = pp * vp
        layout = {"format": "touchstone-shards", "format_version": 1, "tp": tp, "pp": stages,
                  "tie_embeddings": bool(golden.model["tie_embeddings"]), "tied_embedding_grads": "summed"}
        layout["stage_layers"] = [int(golden.model["num_layers"]) // stages] * stages
        with open(os.path.join(out_dir, "shards.json"), "w") as f:
            json.dump(layout, f, indent=1)


def _loss(losses: List[Dict[str, torch.Tensor]], golden: GoldenFile, num_micro: int, dp: int) -> Dict[str, Any]:
    """The step's objective and token count from the micro-batches' [sum, count], over dp ranks."""
    from megatron.core import parallel_state

    sums = torch.stack([x["lm loss"].to(torch.float64) for x in losses])  # [micro, 2]
    if golden.loss_normalization == "global_token_mean":
        local = torch.stack([sums[:, 0].sum(), sums[:, 1].sum()])
    else:  # the mean of the micro-batch means
        local = torch.stack([(sums[:, 0] / sums[:, 1].clamp_min(1)).sum(), sums[:, 1].sum()])
    torch.distributed.all_reduce(local, group=parallel_state.get_data_parallel_group())
    count = int(round(float(local[1])))
    if golden.loss_normalization == "global_token_mean":
        loss = float(local[0]) / max(count, 1)
    else:
        loss = float(local[0]) / (num_micro * dp)
    return {"loss": loss, "num_loss_tokens": count}


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def launch(golden_path: str, out_dir: str, tp: int = 1, pp: int = 1, dp: int = 1, steps: Optional[int] = None,
           sites: Iterable[str] = float32_sites.SITES, vp: int = 1) -> None:
    """Spawns tp x pp x dp gloo ranks on 127.0.0.1 that write the candidate shards into `out_dir`."""
    launch_jobs([{"golden": golden_path, "out": out_dir, "tp": tp, "pp": pp, "dp": dp, "vp": vp, "steps": steps,
                  "sites": sites}])


def launch_jobs(jobs: Sequence[Dict[str, Any]]) -> None:
    """Runs several candidates of one world size (tp x pp x dp) in one set of spawned ranks, in turn.

    Each job: {"golden", "out", "tp", "pp", "dp", "vp" (virtual stages per pipeline stage, default 1:
    interleaved 1F1B above 1), "steps" (None: all), "sites" (the fixes applied; a BF16 run fixes none),
    "set_tp_attributes" (default true: on Megatron-Core 0.16.1 at tp > 1 mark the sharded weights
    tensor-parallel, which 0.16.1 does not do for loaded weights; false shows its defect)}.
    Everything is checked (version, golden files, layouts, output directories) before a rank starts.
    """
    import torch.multiprocessing as mp

    float32_sites.check_version()  # refused here, before a rank starts, as is what follows
    checked, worlds = [], set()
    for job in jobs:
        tp, pp, dp, vp = (int(job.get(k, 1)) for k in ("tp", "pp", "dp", "vp"))
        for name, size in (("tp", tp), ("pp", pp), ("dp", dp), ("vp", vp)):
            if size < 1:
                raise ValueError(f"--{name} {size} is not a size (1, 2, ...)")
        if vp > 1 and pp < 2:
            raise ValueError(f"--vp {vp}: virtual pipeline stages need --pp 2 or more")
        out = os.fspath(job["out"])
        if os.path.exists(out) and (not os.path.isdir(out) or os.listdir(out)):
            raise ValueError(f"{out}: exists and is not an empty directory (the candidate shards go there)")
        with GoldenFile(job["golden"]) as golden:
            check_golden(golden, tp, pp, dp, vp)
        worlds.add(tp * pp * dp)
        checked.append({"golden": os.fspath(job["golden"]), "out": out, "tp": tp, "pp": pp, "vp": vp,
                        "steps": job.get("steps"), "set_tp_attributes": bool(job.get("set_tp_attributes", True)),
                        "sites": float32_sites.check_sites(
                            job.get("sites", float32_sites.SITES))})
    if len(worlds) != 1:
        raise ValueError(f"jobs of world sizes {sorted(worlds)}: one launch runs one world size")
    for job in checked:
        os.makedirs(job["out"], exist_ok=True)
    world = worlds.pop()
    mp.start_processes(train_rank, args=(world, free_port(), checked), nprocs=world, join=True,
                       start_method="spawn")
