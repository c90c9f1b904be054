"""The golden objective computed from logits (torch), micro-batch by micro-batch.

The golden targets are already shifted: position i is trained to predict targets[i]. Compute the
cross entropy from the logits against them directly; Hugging Face's `labels=` argument would shift
them once more and drop the last position of every window.

    for micro in golden.micro_batches(step):
        logits = model(...).logits
        loss, per_token = micro_batch_loss(logits, micro)
        loss.backward()          # the accumulated gradient is the golden objective's
        objective += float(loss)
"""

from __future__ import annotations

from typing import Any, Tuple

from touchstone.golden import IGNORE_INDEX, MicroBatch


def token_losses(logits: Any, targets: Any) -> Any:
    """Cross entropy of every position, [b, T] in the logits' dtype; 0 where the target is -100."""
    import torch
    import torch.nn.functional as F

    targets = torch.as_tensor(targets, dtype=torch.long, device=logits.device)
    if logits.shape[:-1] != targets.shape:
        raise ValueError(f"logits {list(logits.shape)} do not match targets {list(targets.shape)}: "
                         "pass the logits of every position (no shift)")
    per_token = F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=IGNORE_INDEX,
                                reduction="none")
    return per_token.view(targets.shape)


def micro_batch_loss(logits: Any, micro: MicroBatch) -> Tuple[Any, Any]:
    """(this micro-batch's share of the golden objective, its per-token losses): the sum of its token
    losses times `micro.loss_weight` (1/N_global, or 1/(N_micro * B/mbs) for per_microbatch_mean)."""
    per_token = token_losses(logits, micro.targets)
    return per_token.sum() * micro.loss_weight, per_token
