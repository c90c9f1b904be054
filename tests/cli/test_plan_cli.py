"""Command line of `touchstone plan memory | scaling | calendar`: the acceptance numbers exactly as
printed, the scaling example shipped in docs/examples, the chart file, and bad input as a one-line
error with exit status 2.

Usage: test_plan_cli.py PATH_TO_TOUCHSTONE   (standard library only)
"""
import os
import subprocess
import sys
import tempfile
import unittest
import xml.dom.minidom

TOUCHSTONE = None
EXAMPLES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "docs", "examples")
ACCEPTANCE_CSV = os.path.join(EXAMPLES, "scaling_acceptance.csv")
HEADER = ("gpus,tp,pp,dp,global_batch,micro_batch,window_start_s,window_end_s,updates,tokens,"
          "checkpoint_in_window,warmup_excluded")


def run(*args):
    return subprocess.run([TOUCHSTONE, "plan", *args], capture_output=True, text=True, timeout=120)


class PlanCli(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()

    def tearDown(self):
        self.dir.cleanup()

    def ok(self, *args):
        result = run(*args)
        self.assertEqual(result.returncode, 0, result.stderr + result.stdout)
        return result.stdout

    def assert_refused(self, args, message):
        result = run(*args)
        self.assertEqual(result.returncode, 2, result.stderr + result.stdout)
        lines = result.stderr.strip().splitlines()
        self.assertEqual(len(lines), 1, result.stderr)
        self.assertIn(message, lines[0])

    def write(self, name, text):
        path = os.path.join(self.dir.name, name)
        with open(path, "w") as f:
            f.write(text)
        return path

    # ---- memory ----
    def test_memory_acceptance(self):
        out = self.ok("memory", "--params", "500e9", "--tp", "8", "--pp", "8", "--dp", "1,8,80",
                      "--recipe", "bf16", "--distributed-optimizer", "--gpu-memory-gb", "80")
        self.assertIn("parameters per GPU: 7.8125e9", out)
        rows = {line.split()[0]: line.split() for line in out.splitlines()
                if line.strip()[:2] in ("1 ", "8 ", "80")}
        self.assertEqual(rows["1"][6], "140.63")
        self.assertEqual(rows["8"][6], "58.59")
        self.assertEqual(rows["80"][6], "48.05")
        self.assertIn("DOES NOT FIT", " ".join(rows["1"]))
        self.assertNotIn("DOES NOT FIT", " ".join(rows["8"]))
        self.assertIn("DP 8 leaves 82.03 GB per GPU more room than DP 1.", out)
        self.assertIn("6 + 12/DP", out)

    def test_memory_recipes(self):
        for recipe, plain in (("bf16", "18"), ("fp16", "20"), ("fp32", "16"), ("fp64", "32")):
            out = self.ok("memory", "--params", "1e9", "--recipe", recipe)
            self.assertIn("bytes per parameter: " + plain, out)

    def test_memory_zero_stages(self):
        # FP64 holds 8 + 8 + 16 bytes per parameter: stage 1 shards the moments, 2 also the gradients,
        # 3 also the weights (docs/planning.md); at DP 4: 20, 14 and 8.
        for stage, per_param in (("1", "20.000"), ("2", "14.000"), ("3", "8.000")):
            out = self.ok("memory", "--params", "1e9", "--recipe", "fp64", "--dp", "4", "--zero-stage", stage)
            rows = [line.split() for line in out.splitlines() if line.split()[:1] == ["4"]]
            self.assertEqual(rows[0][1], per_param, stage)
        self.assertIn("ZeRO stage 3", out)
        result = run("memory", "--params", "1e9", "--zero-stage", "4")
        self.assertNotEqual(result.returncode, 0)

    def test_memory_stages_with_shapes(self):
        out = self.ok("memory", "--layers", "8", "--hidden", "1024", "--heads", "16", "--ffn", "4096",
                      "--vocab", "32000", "--seq-length", "2048", "--tp", "2", "--pp", "4", "--dp", "2",
                      "--global-batch", "64", "--sequence-parallel", "--recompute", "selective",
                      "--gpu-memory-gb", "1")
        self.assertIn("32 micro-batches per replica per update", out)
        self.assertIn("DOES NOT FIT: DP 2, stage 0", out)

    def test_memory_virtual_stages(self):
        # Interleaved 1F1B, pp 4 x v 2 with 32 micro-batches: the first stage holds (4 - 1) 2 + (2 - 1) 4 + 1
        # = 11 chunk sets of 1 layer (Megatron-LM's warm-up plus one), the last 5.
        shape = ["--layers", "8", "--hidden", "1024", "--heads", "16", "--ffn", "4096", "--vocab", "32000",
                 "--seq-length", "2048", "--pp", "4", "--global-batch", "32"]
        out = self.ok("memory", *shape, "--virtual-stages", "2")
        self.assertIn("TP 1 x PP 4 (2 virtual stages each, interleaved 1F1B)", out)
        rows = {r[0]: r for r in (line.split() for line in out.splitlines()) if len(r) > 5 and r[0].isdigit()}
        self.assertEqual((rows["0"][1], rows["0"][4]), ("2", "11"))
        self.assertEqual((rows["3"][1], rows["3"][4]), ("2", "5"))
        self.assert_refused(["memory", *shape[:-1], "30", "--virtual-stages", "2"],
                            "interleaved 1F1B: the 30 micro-batches per replica at DP 1 are not a multiple of "
                            "the pipeline-parallel size 4")
        self.assert_refused(["memory", *shape, "--virtual-stages", "2", "--stage-layers", "2,2,2,2"],
                            "the stage layer counts list 4 stages but the pipeline-parallel size x virtual "
                            "stages is 8")
        self.assert_refused(["memory", *shape, "--virtual-stages", "0"], "--virtual-stages: must be in [1, 1048576], got 0")
        # The FP64 trainer's own layout, every rank: the peak is named by chunk.
        out = self.ok("memory", "--set", "parallel.pp=2", "--set", "parallel.virtual_stages=2", "--set",
                      "model.num_layers=4", "--ranks")
        self.assertIn(", chunk ", out[out.index("Per rank, bytes"):])

    def test_memory_fp64_trainer_from_config(self):
        out = self.ok("memory", "--set", "train.steps=1", "--breakdown")
        self.assertIn("Touchstone's FP64 trainer", out)
        self.assertIn("lse: 4,160", out)  # its log-sum-exp (4,096 bytes and the arena header), no [T, T]
        self.assertNotIn("probs", out)
        # One step that saves no optimizer state: weights and gradients only (16 bytes per parameter).
        self.assertIn("train.steps = 1: the update forms AdamW's moments piece by piece and keeps none", out)
        self.assertRegex(out, r"Peak: model state 2,003,968 \+ [0-9,]+ at micro-batch 3, backward")
        out = self.ok("memory", "--set", "train.steps=3", "--breakdown")  # and the moments with more steps
        self.assertNotIn("keeps none", out)
        self.assertRegex(out, r"Peak: model state 4,007,936 \+ [0-9,]+ at micro-batch 3, backward")

    def test_memory_every_rank(self):
        out = self.ok("memory", "--set", "parallel.tp=2", "--set", "parallel.pp=2", "--set", "parallel.dp=2",
                      "--set", "model.num_layers=4", "--ranks")
        per_rank = out[out.index("Per rank, bytes"):]
        rows = [line.split() for line in per_rank.splitlines() if line.split()[:1] and line.split()[0].isdigit()]
        self.assertEqual([r[0] for r in rows], [str(rank) for rank in range(8)])
        self.assertEqual({(r[1], r[2], r[3], r[4]) for r in rows},
                         {(tp, "0", dp, stage) for tp in "01" for dp in "01" for stage in "01"})
        self.assertIn("dp all-reduce padded copy", out)
        self.assertIn("pp send copy: activation of micro-batch", out)
        self.assert_refused(["memory", "--ranks", "--layers", "4"], "--ranks needs a Touchstone config")
        self.assert_refused(["memory", "--set", "parallel.tp=2", "--ranks", "--tp", "4"],
                            "instead of --tp, use --set")

    def test_memory_context_parallel(self):
        # Every rank of a cp = 2 x dp = 2 layout, its cp rank in the third column; the cp group's buffers
        # and the dp_cp group's, by name.
        out = self.ok("memory", "--set", "parallel.cp=2", "--set", "parallel.dp=2", "--ranks")
        self.assertIn("TP 1 x CP 2 x PP 1", out)
        self.assertIn("the optimizer shards over DP x CP", out)
        per_rank = out[out.index("Per rank, bytes"):]
        rows = [line.split() for line in per_rank.splitlines() if line.split()[:1] and line.split()[0].isdigit()]
        self.assertEqual([(r[0], r[2], r[3]) for r in rows],
                         [("0", "0", "0"), ("1", "1", "0"), ("2", "0", "1"), ("3", "1", "1")])
        self.assertIn("cp send copy: K/V block", out)
        self.assertIn("dp_cp all-reduce padded copy", out)
        # Without a config: the flags, and the 16-bit model over cp ranks with its K/V buffers.
        shape = ["--layers", "4", "--hidden", "64", "--heads", "4", "--ffn", "176", "--vocab", "256",
                 "--seq-length", "64", "--global-batch", "8"]
        out = self.ok("memory", *shape, "--cp", "2", "--cp-comm", "allgather", "--flash-attention")
        self.assertIn("context-parallel K/V buffers of one layer", out)
        self.assert_refused(["memory", *shape, "--cp", "0"], "--cp: must be in [1, 1048576], got 0")
        self.assert_refused(["memory", *shape, "--cp", "2", "--cp-comm", "ring", "--flash-attention"],
                            '--cp-comm: unknown value "ring" ("p2p" or "allgather")')
        self.assert_refused(["memory", *shape, "--cp", "3", "--flash-attention"],
                            "2 x the context-parallel size (6) must divide the sequence length (64)")
        self.assert_refused(["memory", *shape, "--cp", "2"], "the megatron-16bit model needs flash attention")
        self.assert_refused(["memory", "--set", "parallel.cp=2", "--ranks", "--cp", "4"],
                            "instead of --cp, use --set")
        # Four factors at their bound of 2^20 each: the product is refused, never formed.
        self.assert_refused(["memory", *[arg for key in ("tp", "cp", "pp", "dp")
                                         for arg in ("--set", f"parallel.{key}=1048576")]],
                            "config: parallel: tp x cp x pp x dp is more than 1048576 processes")

    def test_memory_errors(self):
        shape = ["--layers", "4", "--hidden", "64", "--heads", "4", "--ffn", "176", "--vocab", "256",
                 "--seq-length", "64"]
        # How values fit together: the planner says what each value means.
        self.assert_refused(["memory", *shape, "--pp", "8"],
                            "the pipeline-parallel size 8 is larger than the 4 layers")
        self.assert_refused(["memory", *shape, "--dp", "3", "--global-batch", "8"],
                            "the global batch 8 is not divisible by DP 3 x micro-batch 1 = 3")
        self.assert_refused(["memory", *shape, "--tp", "8"],
                            "the tensor-parallel size (8) must divide the heads (4) and the KV heads (4)")
        # One flag's value, or a flag that needs another: the error names the flags.
        self.assert_refused(["memory", *shape, "--tp", "0"], "--tp: must be in [1, 1048576], got 0")
        self.assert_refused(["memory", *shape, "--dp", "1,0"], "--dp: must be in [1, 1048576], got 0")
        self.assert_refused(["memory", "--params", "-5"], "--params: must be > 0")
        self.assert_refused(["memory", "--params", "1e9", "--recipe", "int4"],
                            "--recipe: unknown recipe \"int4\" (known: bf16, fp16, fp32, fp64)")
        self.assert_refused(["memory", *shape, "--recompute", "some"], "--recompute: unknown value \"some\"")
        self.assert_refused(["memory", *shape, "--activations", "fp8"], "--activations: unknown model \"fp8\"")
        self.assert_refused(["memory"], "give --params or the model's shape (--layers, --hidden, --heads")
        self.assert_refused(["memory", "--params", "1e9", "--stage-layers", "1,1"], "--stage-layers needs --layers")
        self.assert_refused(["memory", "--set", "train.stepz=1"], "--set train.stepz=1: unknown config key")

    def test_memory_window_of_any_length_without_context_parallelism(self):
        # cp = 1 cuts no window: an odd sequence length is planned, and `touchstone golden` (whose memory
        # check is the planner's) runs it, as `touchstone config` accepts it.
        shape = ["--layers", "4", "--hidden", "64", "--heads", "4", "--ffn", "176", "--vocab", "256"]
        self.assertIn("all in-flight micro-batches stored", self.ok("memory", *shape, "--seq-length", "63"))
        self.ok("memory", *shape, "--seq-length", "63", "--recipe", "fp64")
        self.assert_refused(["memory", *shape, "--seq-length", "63", "--cp", "2", "--flash-attention"],
                            "2 x the context-parallel size (4) must divide the sequence length (63)")
        golden = subprocess.run([TOUCHSTONE, "golden", "--set", "model.seq_length=17", "--set", "train.steps=1",
                                 "--out", os.path.join(self.dir.name, "g.h5")],
                                capture_output=True, text=True, timeout=300)
        self.assertEqual(golden.returncode, 0, golden.stderr + golden.stdout)

    def test_memory_huge_values_are_refused_before_any_is_formed(self):
        shape = ["--layers", "4", "--hidden", "64", "--heads", "4", "--ffn", "176", "--vocab", "256",
                 "--seq-length", "64"]
        int64_max = "9223372036854775807"
        self.assert_refused(["memory", "--params", "500e9", "--pp", int64_max],
                            "--pp: must be in [1, 1048576], got " + int64_max)
        self.assert_refused(["memory", "--params", "500e9", "--tp", "4294967296", "--pp", "4294967296"],
                            "--tp: must be in [1, 1048576], got 4294967296")
        self.assert_refused(["memory", "--params", "500e9", "--tp", "1024", "--pp", "1024", "--dp", "1,2"],
                            "--tp x --cp x --pp x --dp: 1024 x 1 x 1024 x 2 is more than 1048576")
        self.assert_refused(["memory", *shape, "--vocab-multiple", int64_max],
                            "--vocab-multiple: must be in [1, 2147483647], got " + int64_max)
        self.assert_refused(["memory", "--params", "1e9", "--pp", "2", "--virtual-stages", "4611686018427387904"],
                            "--virtual-stages: must be in [1, 1048576], got 4611686018427387904")
        self.assert_refused(["memory", "--params", "1e9", "--pp", "1024", "--virtual-stages", "2048"],
                            "--pp x --virtual-stages: 1024 x 2048 is more than 1048576")
        self.assert_refused(["memory", "--params", "1e30"], "--params: 1e30 is more than 9.007199254740992e15")
        self.assert_refused(["memory", "--params", "1e308T"], "--params: \"1e308T\" is not a finite number")
        self.assert_refused(["memory", "--params", "1e9", "--gpu-memory-gb", "nan"], "--gpu-memory-gb")
        self.assert_refused(["memory", "--params", "1e9", "--gpu-memory-gb", "0"], "--gpu-memory-gb: must be > 0")
        self.assert_refused(["memory", "--params", "1e9", "--gpu-memory-gb", "-0"], "--gpu-memory-gb: must be > 0")
        # A value given is never read as "not given".
        self.assert_refused(["memory", *shape, "--global-batch", "0"], "--global-batch: must be in [1, 2147483647], got 0")
        self.assert_refused(["memory", *shape, "--global-batch", "-4"], "--global-batch: must be in [1, 2147483647], got -4")
        self.assert_refused(["memory", "--params", "1e9", "--layers", "-5"], "--layers: must be in [1, 2147483647], got -5")
        self.assert_refused(["memory", *shape, "--kv-heads", "0"], "--kv-heads: must be in [1, 2147483647], got 0")
        # The interleaved schedule is replayed step by step: an immense batch is refused, not run for hours.
        self.assert_refused(["memory", *shape, "--pp", "2", "--virtual-stages", "2", "--global-batch", "2000000000"],
                            "the replay: micro-batches x virtual stages: 2000000000 x 2 is more than 16777216")

    def test_memory_refusal_after_the_plan_prints_no_partial_report(self):
        # --breakdown and --ranks are checked after the plan is made: the report is printed whole or not at all.
        result = run("memory", "--params", "1e9", "--breakdown")
        self.assertEqual(result.returncode, 2, result.stderr)
        self.assertEqual(result.stdout, "")
        result = run("memory", "--set", "model.num_layers=32", "--set", "train.global_batch_size=512", "--ranks")
        self.assertEqual(result.returncode, 2, result.stderr)
        self.assertIn("the touchstone-fp64 replay: the layers of a stage x the micro-batches per replica: 8192",
                      result.stderr)
        self.assertEqual(result.stdout, "")

    def test_path_names_too_long_are_input_errors(self):
        long_name = os.path.join(self.dir.name, "a" * 300)
        self.assert_refused(["memory", "--config", long_name], "--config " + long_name + ": File name too long")
        self.assert_refused(["scaling", "--csv", ACCEPTANCE_CSV, "--svg", os.path.join(long_name, "x.svg")],
                            "File name too long")

    # ---- scaling ----
    def test_scaling_acceptance_example(self):
        svg = os.path.join(self.dir.name, "scaling.svg")
        out = self.ok("scaling", "--csv", ACCEPTANCE_CSV, "--svg", svg)
        rows = [line.split() for line in out.splitlines()
                if line.split()[:1] in (["512"], ["1024"], ["2560"], ["5120"])]
        self.assertEqual([r[3] for r in rows], ["8", "16", "40", "80"])
        self.assertEqual([r[6] for r in rows], ["240", "120", "48", "24"])
        self.assertEqual(rows[0][10], "180,000")
        self.assertEqual(rows[1][10], "320,000")
        self.assertEqual(rows[1][11], "1.78x")
        self.assertEqual(rows[1][12], "89%")
        # Bubbles of 1F1B, interleaved 1F1B (v = 2) and ZB-H1 at m = 240, pp = 8.
        self.assertEqual(rows[0][13:16], ["2.8%", "1.4%", "1.0%"])
        v4 = self.ok("scaling", "--csv", ACCEPTANCE_CSV, "--virtual-stages", "4")
        self.assertIn("interleaved 1F1B, v = 4 chunks per stage", v4)
        self.assertIn(" 2.8%    0.7%    1.0% ", v4)  # 7 / (4 x 240 + 7)
        self.assertNotIn("warning", out)
        document = xml.dom.minidom.parse(svg)  # well-formed, self-contained
        self.assertEqual(document.documentElement.tagName, "svg")
        with open(svg) as f:
            text = f.read()
        self.assertNotIn("href", text)
        self.assertIn("89%", text)

    def test_scaling_warnings(self):
        out = self.ok("scaling", "--csv", os.path.join(EXAMPLES, "scaling_not_comparable.csv"))
        warnings = [line for line in out.splitlines() if line.startswith("warning: ")]
        self.assertEqual(len(warnings), 4, out)
        self.assertIn("cold start mixed with steady state", out)
        self.assertIn("checkpoint saves fall inside the window of 2560 GPUs only", out)

    def test_scaling_errors(self):
        bad_row = self.write("runs.csv", HEADER + "\n512,8,8,8,1920,1,1800,3512,20,308160000,0,1\n"
                             "1024,8,8,16,1920,1,x,2463,20,1,0,1\n")
        self.assert_refused(["scaling", "--csv", bad_row],
                            "runs.csv:3: column window_start_s: \"x\" is not a number")
        not_dividing = self.write("batch.csv", HEADER + "\n448,8,8,7,1920,1,1500,2463,20,308160000,0,1\n")
        self.assert_refused(["scaling", "--csv", not_dividing],
                            "batch.csv:2: global_batch 1920 is not divisible by dp")
        self.assert_refused(["scaling", "--csv", os.path.join(self.dir.name, "missing.csv")], "cannot open")
        self.assert_refused(["scaling", "--csv", ACCEPTANCE_CSV, "--virtual-stages", "1"],
                            "--virtual-stages: must lie in [2, 1048576], got 1")
        missing_dir = os.path.join(self.dir.name, "no", "x.svg")
        self.assert_refused(["scaling", "--csv", ACCEPTANCE_CSV, "--svg", missing_dir], "does not exist")

    def test_scaling_counts_past_exact_doubles_are_refused(self):
        huge = self.write("huge.csv", HEADER + "\n512,8,8,8,1920,1,1800,3512,20,1e30,0,1\n")
        self.assert_refused(["scaling", "--csv", huge], "huge.csv:2: column tokens: 1e30 must be <= 2^53")
        short = self.write("short.csv", HEADER + "\n512,8,8,8,1920,1,0,1e-300,20,308160000,0,1\n")
        self.assert_refused(["scaling", "--csv", short],
                            "short.csv:2: tokens / (window_end_s - window_start_s) = inf tokens/s, more than 2^53")

    # ---- calendar ----
    def test_calendar_acceptance(self):
        out = self.ok("calendar", "--tokens", "10T", "--throughput", "1.6M", "--throughput-kind", "compute",
                      "--calendar-efficiency", "90%", "--start-date", "2025-01-06")
        self.assertIn("Pure compute:        72.34 days", out)
        self.assertIn("Calendar time:       80.38 days", out)
        self.assertIn("End:                 2025-03-27 09:00 UTC", out)
        self.assertIn("Trial runs are billed separately", out)

    def test_calendar_efficiency_as_a_fraction_or_a_percentage(self):
        for efficiency in ("0.9", "90%"):
            out = self.ok("calendar", "--tokens", "10T", "--throughput", "1.6M", "--throughput-kind", "compute",
                          "--calendar-efficiency", efficiency)
            self.assertIn("Calendar efficiency: 90% of wall-clock time trains", out)
            self.assertIn("Calendar time:       80.38 days", out)

    def test_calendar_errors(self):
        compute = ["calendar", "--tokens", "10T", "--throughput", "1.6M", "--throughput-kind", "compute"]
        self.assert_refused(["calendar", "--tokens", "10T", "--throughput", "-1.6M", "--throughput-kind",
                             "compute"], "throughput: must be > 0 tokens/s, got -1.6e6")
        self.assert_refused([*compute, "--tokens-done", "11T"], "tokens done: 11T is more than the 10T tokens to train")
        self.assert_refused([*compute, "--calendar-efficiency", "1.5"],
                            "calendar efficiency: must be in (0, 1], got 1.5000")
        self.assert_refused([*compute, "--start-date", "2025-02-30"],
                            '--start-date: "2025-02-30" is not a valid date')
        self.assert_refused([*compute, "--start-date", "06/01/2025"],
                            '--start-date: "06/01/2025" is not a date of the form YYYY-MM-DD')
        self.assert_refused(["calendar", "--tokens", "10T", "--throughput", "1.6M", "--throughput-kind", "measured"],
                            '--throughput-kind: unknown value "measured" (compute or wall-clock)')
        self.assert_refused(["calendar", "--tokens", "10T", "--throughput", "1.6M", "--throughput-kind",
                             "wall-clock", "--calendar-efficiency", "0.9"], "count them twice")
        self.assert_refused(["calendar", "--tokens", "10Q", "--throughput", "1.6M", "--throughput-kind",
                             "compute"], "unknown suffix")

    def test_calendar_far_dates_and_huge_counts_are_refused(self):
        # 10T tokens at 1.6 tokens/s: 72,337,962.96 days, about the year 200,079; past 9999-12-31 the end
        # date is refused, and the days alone are printed without --start-date.
        slow = ["calendar", "--tokens", "10T", "--throughput", "1.6", "--throughput-kind", "compute"]
        self.assert_refused([*slow, "--start-date", "2025-01-06"],
                            "end date: 72337962.96 calendar days from 2025-01-06 00:00 UTC end past 9999-12-31")
        self.assertIn("Calendar time:       72337962.96 days", self.ok(*slow))
        self.assert_refused(["calendar", "--tokens", "10T", "--throughput", "1", "--throughput-kind", "compute",
                             "--start-date", "2025-01-06"], "end past 9999-12-31")
        self.assert_refused(["calendar", "--tokens", "1e308", "--throughput", "1", "--throughput-kind",
                             "compute"], "tokens to train: 1e308 is more than 9.007199254740992e15")
        self.assert_refused(["calendar", "--tokens", "10T", "--throughput", "1e-310", "--throughput-kind",
                             "compute"], "calendar time: the remaining tokens over the throughput take inf days")
        self.assert_refused([*slow, "--start-date", "-001-01-01"], "is not a date of the form YYYY-MM-DD")
        self.assert_refused([*slow, "--start-date", " 202-01-01"], "is not a date of the form YYYY-MM-DD")
        out = self.ok("calendar", "--tokens", "10T", "--throughput", "1.6M", "--throughput-kind", "compute",
                      "--tokens-done", "-0")
        self.assertIn(" 0 done,", out)


if __name__ == "__main__":
    TOUCHSTONE = os.path.abspath(sys.argv.pop(1))
    unittest.main()
