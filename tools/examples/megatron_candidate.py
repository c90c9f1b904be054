#!/usr/bin/env python3
"""Replay a golden file with Megatron-Core (GPTModel, its 1F1B schedule, DDP, optimizer and scheduler)
on the CPU and write the candidate as per-rank shards for `touchstone diff` (docs/frameworks/megatron.md).

usage: PYTHONPATH=MEGATRON_CORE:python megatron_candidate.py GOLDEN.h5 --out DIR [--tp N --pp N --dp N]
           [--steps N] [--keep-float32 SITE ...]

The golden file must be made with --set optim.schedule_convention=megatron: FP64 (replayed in FP64,
the float32 sites fixed) or with --set precision=bf16 --envelope (replayed in Megatron's BF16). The tp x pp x dp
gloo ranks are spawned here, on 127.0.0.1 with a free port. DIR must not exist or be empty."""
import argparse
import sys

from touchstone.megatron import float32_sites
from touchstone.megatron.run import launch


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("golden")
    parser.add_argument("--out", required=True, help="directory for the shards (created)")
    parser.add_argument("--tp", type=int, default=1)
    parser.add_argument("--pp", type=int, default=1)
    parser.add_argument("--dp", type=int, default=1)
    parser.add_argument("--vp", type=int, default=1, help="virtual stages per pipeline stage (interleaved 1F1B)")
    parser.add_argument("--steps", type=int, default=None, help="the first N golden steps (default all)")
    parser.add_argument("--keep-float32", action="append", default=[], choices=float32_sites.SITES,
                        help="leave this float32 site of Megatron-Core unfixed (to see what it does)")
    args = parser.parse_args(argv)
    sites = [s for s in float32_sites.SITES if s not in args.keep_float32]
    try:
        launch(args.golden, args.out, tp=args.tp, pp=args.pp, dp=args.dp, vp=args.vp, steps=args.steps, sites=sites)
    except ValueError as e:
        print(f"megatron_candidate.py: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
