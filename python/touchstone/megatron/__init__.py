"""Megatron-Core itself in the loop: replay a golden file with its GPTModel, schedules and optimizer.

    from touchstone.megatron import launch
    launch("golden.h5", "candidate/", tp=2, pp=2, dp=1)      # then: touchstone diff golden.h5 candidate/

- `cpu_shims`: lets Megatron-Core run on the CPU (gloo) without changing a number.
- `float32_sites`: the six places a float64 Megatron-Core model computes in float32, and their fixes.
- `model`: GPTModel (local spec) of the golden config, holding /params/init cut for this rank.
- `run`: the training loop, Megatron-LM's train_step with Megatron-Core's pieces, and `launch`.

Needs torch and megatron-core (0.16.1 or 0.19.2, `float32_sites.KNOWN_VERSIONS`); docs/frameworks/megatron.md.
"""

from touchstone.megatron.run import launch

__all__ = ["launch"]
