"""Parallel runs seen from the command line: the teaching trace of a PP2 step (1F1B, ZB-H1, interleaved)
lists the expected forward/backward order per stage and every transfer; the timeline of a CP2 step draws
every context-parallel transfer; every invalid layout ends all ranks with a non-zero status within
seconds, the message printed once.

Usage: test_parallel_cli.py PATH_TO_TOUCHSTONE   (standard library only)
"""
import glob
import os
import re
import subprocess
import sys
import tempfile
import time
import unittest

TOUCHSTONE = None


def mpirun(ranks, *args, timeout=120):
    """Runs touchstone on `ranks` processes; returns (the finished process, its seconds). Its stdout is every
    rank's own stdout, whole, in rank order: mpirun forwards the ranks' output in the chunks it happens to
    read from their pipes, so in its own stdout a line of one rank can be cut by another rank's text
    (seen with the trace of four ranks); --output-filename keeps each rank's output in a file of its own.
    stderr is mpirun's."""
    launcher = ["mpirun", "--oversubscribe"] + (["--allow-run-as-root"] if os.geteuid() == 0 else [])
    with tempfile.TemporaryDirectory() as outputs:
        start = time.monotonic()
        result = subprocess.run([*launcher, "--output-filename", outputs, "-np", str(ranks), TOUCHSTONE, *args],
                                capture_output=True, text=True, timeout=timeout)
        seconds = time.monotonic() - start
        files = glob.glob(os.path.join(outputs, "*", "rank.*", "stdout"))  # <dir>/<job>/rank.<r>/stdout
        if files:
            files.sort(key=lambda f: int(os.path.basename(os.path.dirname(f)).split(".")[1]))
            texts = []
            for name in files:
                with open(name) as f:
                    texts.append(f.read())
            result.stdout = "".join(texts)
    return result, seconds


class Trace(unittest.TestCase):
    def test_pp2_1f1b_step_runs_the_schedule(self):
        with tempfile.TemporaryDirectory() as d:
            svg = os.path.join(d, "timeline.svg")
            result, _ = mpirun(2, "train", "--set", "parallel.pp=2", "--set", "train.steps=1", "--trace",
                               "--timeline", svg)
            self.assertEqual(result.returncode, 0, result.stderr)
            out = result.stdout
            # B = 8 windows, 2 per micro-batch: 4 micro-batches. Stage 0 warms up with one forward.
            self.assertIn("stage 0: F0 F1 B0 F2 B1 F3 B2 B3", out)
            self.assertIn("stage 1: F0 B0 F1 B1 F2 B2 F3 B3", out)
            # The measured bubble of the step, per stage.
            self.assertRegex(out, r"pipeline idle: stage 0 \d+\.\d%, stage 1 \d+\.\d% of \d+\.\d{3} s")
            with open(svg) as f:
                text = f.read()
            self.assertTrue(text.startswith("<svg") or text.startswith("<?xml"))
            self.assertEqual(text.count('class="event'), 16)
            self.assertNotIn("context-transfer", text)  # no context parallelism, nothing of it drawn
        # Every point-to-point transfer: 4 activations forward, 4 gradients back, [2 windows x 64, 64].
        sends = [l for l in out.splitlines() if re.search(r"\bsend\b", l) and "group=pp" in l]
        recvs = [l for l in out.splitlines() if re.search(r"\brecv\b", l) and "group=pp" in l]
        self.assertEqual(len(sends), 8, "\n".join(sends))
        self.assertEqual(len(recvs), 8)
        for line in sends + recvs:
            self.assertIn("shape=[128,64]", line)
            self.assertIn("bytes=65536", line)
            self.assertRegex(line, r"step 1 mb \d (forward|backward)")
            self.assertRegex(line, r"peer=\d")

    def test_pp2_zb_h1_step_runs_the_split_backward(self):
        with tempfile.TemporaryDirectory() as d:
            svg = os.path.join(d, "timeline.svg")
            result, _ = mpirun(2, "train", "--set", "parallel.pp=2", "--set", "parallel.schedule=zb_h1",
                               "--set", "train.steps=1", "--trace", "--timeline", svg)
            self.assertEqual(result.returncode, 0, result.stderr)
            # Stage 0 runs each W after its I; stage 1 keeps one W pending (docs/parallelism.md).
            self.assertIn("stage 0: F0 F1 I0 W0 F2 I1 W1 F3 I2 W2 I3 W3", result.stdout)
            self.assertIn("stage 1: F0 I0 F1 I1 W0 F2 I2 W1 F3 I3 W2 W3", result.stdout)
            with open(svg) as f:
                text = f.read()
            self.assertEqual(text.count('class="event weight"'), 8)  # 4 micro-batches x 2 stages
            self.assertIn("backward, weight gradients", text)


    def test_pp2_interleaved_step_runs_megatrons_order(self):
        with tempfile.TemporaryDirectory() as d:
            svg = os.path.join(d, "timeline.svg")
            result, _ = mpirun(2, "train", "--set", "parallel.pp=2", "--set", "parallel.virtual_stages=2",
                               "--set", "model.num_layers=4", "--set", "train.steps=1", "--trace", "--timeline", svg)
            self.assertEqual(result.returncode, 0, result.stderr)
            out = result.stdout
            # Megatron-LM's interleaved order, worked by hand for p = 2, v = 2, m = 4 (groups of p = 2
            # micro-batches through chunk 0 then chunk 1; backwards from the last chunk): stage 0 warms up
            # with (p - 1) 2 + (v - 1) p = 4 forwards, stage 1 with 2. ":1" marks chunk 1.
            self.assertIn("stage 0: F0 F1 F0:1 F1:1 F2 B0:1 F3 B1:1 F2:1 B0 F3:1 B1 B2:1 B3:1 B2 B3", out)
            self.assertIn("stage 1: F0 F1 F0:1 B0:1 F1:1 B1:1 F2 B0 F3 B1 F2:1 B2:1 F3:1 B3:1 B2 B3", out)
            with open(svg) as f:
                self.assertEqual(f.read().count('class="event'), 32)  # 4 micro-batches x 2 chunks x 2 stages
        # Every pipeline transfer names its chunk: per stage 2 chunks x 4 micro-batches, each sent once
        # forward and once back, except the pipeline's two ends (stage 0's chunk 0 receives no activation
        # and sends no gradient; stage 1's chunk 1 the reverse): 12 sends and 12 receives per stage.
        pp = [l for l in out.splitlines() if "group=pp" in l]
        self.assertEqual(len(pp), 48, "\n".join(pp))
        for line in pp:
            self.assertRegex(line, r"step 1 mb \d chunk [01] (forward|backward) +(send|recv) ")


class TraceSites(unittest.TestCase):
    """Every transfer line of a step names its site: the module and the operation in Megatron-LM's words."""

    def transfer_lines(self, ranks, *sets):
        args = []
        for s in sets:
            args += ["--set", s]
        with tempfile.TemporaryDirectory() as d:
            result, _ = mpirun(ranks, "golden", *args, "--set", "train.steps=1", "--trace", "--out",
                               os.path.join(d, "golden.h5"))
        self.assertEqual(result.returncode, 0, result.stderr)
        lines = [l for l in result.stdout.splitlines() if re.match(r"\[rank \d+ tp", l)]
        self.assertGreater(len(lines), 0)
        return lines

    def test_every_transfer_names_its_site(self):
        layouts = [
            (8, "parallel.tp=2", "parallel.pp=2", "parallel.dp=2", "parallel.sequence_parallel=true",
             "parallel.distributed_optimizer=true", "model.tie_embeddings=true"),
            (4, "parallel.dp=2", "parallel.pp=2", "parallel.zero_stage=3", "parallel.schedule=zb_h1"),
            (4, "parallel.tp=2", "parallel.cp=2", "parallel.sequence_parallel=true"),
            (2, "parallel.cp=2", "parallel.cp_comm=allgather"),
        ]
        for ranks, *sets in layouts:
            unnamed = [l for l in self.transfer_lines(ranks, *sets) if "  site=" not in l]
            self.assertEqual(unnamed, [], sets)

    def test_the_ring_names_each_step(self):
        lines = self.transfer_lines(2, "parallel.cp=2", "model.num_layers=1")
        rank0 = [l for l in lines if l.startswith("[rank 0 ") and "group=cp" in l and " forward " in l]
        # Micro-batch 0: rank 0 passes its own block on, computes with it, and receives rank 1's.
        self.assertIn("site=decoder.layers.0.self_attention.core_attention ring step 0: passing on the K/V of "
                      "cp rank 0", rank0[0])
        self.assertRegex(rank0[1], r"ring step 0: computed with the K/V of cp rank 0 \(\d+ of \d+ tile pairs "
                                   r"skipped\); receiving the K/V of cp rank 1")


class ContextParallelTimeline(unittest.TestCase):
    def test_the_timeline_draws_every_cp_transfer_within_attention(self):
        # --timeline alone (no --trace) records the step. cp 2, 2 layers, 4 micro-batches: per layer and
        # micro-batch the ring waits for the next K/V block (cp - 1 times) and for its sends in the forward,
        # and in the backward waits at each of the cp steps (the next block, and the dK/dV accumulator,
        # which comes home after the last) and for its sends: 2 + 3 strips. The all-gather scheme gathers
        # in the forward, gathers and reduce-scatters in the backward: 3 strips. Stage 0 is drawn from cp
        # rank 0.
        for comm, per_layer in (("p2p", 5), ("allgather", 3)):
            with self.subTest(cp_comm=comm), tempfile.TemporaryDirectory() as d:
                svg = os.path.join(d, "timeline.svg")
                result, _ = mpirun(2, "train", "--set", "parallel.cp=2", "--set", f"parallel.cp_comm={comm}",
                                   "--set", "model.num_layers=2", "--set", "train.steps=1", "--timeline", svg)
                self.assertEqual(result.returncode, 0, result.stderr)
                with open(svg) as f:
                    text = f.read()
                self.assertEqual(text.count('class="event'), 8)
                self.assertEqual(text.count('class="context-transfer"'), per_layer * 2 * 4)
                self.assertIn("context-parallel transfer (within attention)", text)


class ContextParallelTiles(unittest.TestCase):
    def tiles(self, ranks, *sets):
        args = []
        for s in sets:
            args += ["--set", s]
        result, _ = mpirun(ranks, "train", "--set", "model.seq_length=256", "--set", "train.steps=1", *args,
                           "--trace")
        self.assertEqual(result.returncode, 0, result.stderr)
        found = re.findall(r"\[rank (\d+)\] attention tile pairs: computed (\d+), skipped (\d+)", result.stdout)
        self.assertEqual(sorted(int(r) for r, _, _ in found), list(range(ranks)))
        return [(int(c), int(s)) for _, c, s in found]

    def test_chunks_on_tile_edges_compute_the_whole_windows_tile_pairs(self):
        # T = 256 at cp = 2: chunks of 64 positions, one tile each. The ranks' blocks together compute and
        # skip exactly the single-rank run's tile pairs (the split adds no work), each rank a share.
        (single,) = self.tiles(1)
        for comm in ("p2p", "allgather"):
            ranks = self.tiles(2, "parallel.cp=2", f"parallel.cp_comm={comm}")
            self.assertEqual((sum(c for c, _ in ranks), sum(s for _, s in ranks)), single, comm)
            self.assertTrue(all(0 < c < single[0] for c, _ in ranks), ranks)


class InvalidLayouts(unittest.TestCase):
    CASES = [
        (4, ["--set", "parallel.tp=2"], "tp x cp x pp x dp = 2 but the run has 4 process"),
        (2, ["--set", "parallel.tp=2", "--set", "model.num_heads=6", "--set", "model.hidden_size=48",
             "--set", "model.num_kv_heads=3"], "must divide model.num_heads and model.num_kv_heads"),
        (2, ["--set", "parallel.tp=2", "--set", "model.ffn_hidden_size=175"], "must divide model.ffn_hidden_size"),
        (2, ["--set", "parallel.tp=2", "--set", "model.vocab_size=255"], "must divide model.vocab_size"),
        (2, ["--set", "parallel.pp=2", "--set", "model.num_layers=3"], "parallel.pp (2) must divide model.num_layers (3)"),
        (2, ["--set", "parallel.pp=2", "--set", "parallel.stage_layers=[1,2]"], "parallel.stage_layers sums to 3"),
        (2, ["--set", "parallel.cp=2", "--set", "model.seq_length=66"],
         "parallel.cp (2) needs model.seq_length (66) divisible by 2 x parallel.cp"),
        (2, ["--set", "parallel.cp_comm=ring"], 'parallel.cp_comm must be "p2p" or "allgather" (got "ring")'),
        (2, ["--set", "parallel.pp=2", "--set", "parallel.virtual_stages=2", "--set", "model.num_layers=4",
             "--set", "train.micro_batch_size=8"], "= 1) to be a multiple of parallel.pp (2)"),
        (2, ["--set", "parallel.dp=2", "--set", "train.micro_batch_size=3"], "must be divisible by parallel.dp x train.micro_batch_size"),
        (2, ["--set", "parallel.tp=2", "--set", "parallel.sequence_parallel=true", "--set", "model.seq_length=17"],
         "needs model.seq_length divisible by parallel.tp"),
    ]

    def test_every_rank_exits_non_zero_quickly(self):
        for ranks, args, message in self.CASES:
            with self.subTest(args=args), tempfile.TemporaryDirectory() as d:
                out = os.path.join(d, "g.h5")
                result, seconds = mpirun(ranks, "golden", *args, "--out", out, timeout=60)
                self.assertNotEqual(result.returncode, 0)
                self.assertLess(seconds, 30)
                self.assertEqual(result.stderr.count("touchstone: error:"), 1, result.stderr)
                self.assertIn(message, result.stderr)
                self.assertEqual(os.listdir(d), [])


if __name__ == "__main__":
    TOUCHSTONE = os.path.abspath(sys.argv.pop(1))
    unittest.main(verbosity=1)
