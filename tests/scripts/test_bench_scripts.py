#!/usr/bin/env python3
"""CPU checks of the benchmark scripts, standard library only (CI installs no Python packages):
  * bench/peer_triton.py's shape table agrees with src/base/presets.cpp, the one the C++ side uses;
  * scripts/gpu_summary.py prints the peer column (peer µs, mxmoe/peer) or says why the peer did
    not run, for the results bench_moe and bench/peer_triton.py write, and a torch point that failed
    as a dash with the reason bench/torch_baseline.py recorded;
  * scripts/ab_moe.sh and bench/ab_compare.py: rounds alternate between builds, ratios are best
    round over the base's best round, and only ratios beyond both builds' round spreads are marked
    (with stand-in bench_moe executables that write known times); each run's SM clock and power from
    nvidia-smi's samples inside it (a stand-in nvidia-smi), or a note that it was not sampled;
  * scripts/profile_moe.sh and bench/ncu_durations.py: one forward's kernels and durations per
    point, the full profile, failures and usage errors (with a stand-in ncu);
  * bench/ncu_source.py: a kernel's stall samples by reason, by opcode and per instruction, from
    the source page;
  * bench/sass_loops.py: each GEMM kernel's innermost tensor-core loop in SASS, paired with a base
    build's kernel of the same tile, and the opcodes that differ; --walk, the instructions one
    warp issues along one path of a kernel.
    python3 tests/scripts/test_bench_scripts.py
"""
import ast
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import unittest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def read(*path):
    with open(os.path.join(ROOT, *path)) as f:
        return f.read()


def peer_shapes():
    """SHAPES of bench/peer_triton.py, read without importing it (that needs torch)."""
    tree = ast.parse(read("bench", "peer_triton.py"))
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "SHAPES" for t in node.targets):
            return ast.literal_eval(node.value)
    raise AssertionError("bench/peer_triton.py has no SHAPES table")


def cpp_presets():
    """name -> (E, H, I, k, routing, n_group, topk_group, scaling, biases) from src/base/presets.cpp."""
    src = read("src", "base", "presets.cpp")
    presets = {}
    pattern = (r'\{"([\w.-]+)",\s*make\((\d+),\s*(\d+),\s*(\d+),\s*(\w+)\(([^)]*)\),\s*activation_kind::\w+,'
               r'\s*layout::gate_up_order::\w+\),\s*(true|false)\}')
    for name, e, h, i, kind, args, biases in re.findall(pattern, src):
        a = [x.strip().rstrip("f") for x in args.split(",")]
        if kind == "grouped":  # grouped(k, n_group, topk_group, scale)
            routing = ("sigmoid_grouped_topk", int(a[0]), int(a[1]), int(a[2]), float(a[3]))
        else:  # topk_softmax(k) | softmax_topk(k)
            routing = (kind, int(a[0]), 1, 1, 1.0)
        presets[name] = (int(e), int(h), int(i), routing[1], routing[0], routing[2], routing[3], routing[4],
                         biases == "true")
    return presets


class PeerShapes(unittest.TestCase):
    def test_peer_table_matches_the_presets(self):
        presets = cpp_presets()
        self.assertEqual(len(presets), 6, "the presets.cpp pattern no longer matches its table")
        self.assertEqual(peer_shapes(), presets)


def moe_row(shape, tokens, us, peer_us):
    return {"shape": shape, "tokens": tokens, "experts": 128, "topk": 4, "hidden": 2880, "intermediate": 2880,
            "touched_experts": 4.0, "us": us, "floor_us": us / 2, "torch_bf16_us": 2 * us, "peer_us": peer_us,
            "tflops": 1.0, "gbps": 100.0}


def summary(files):
    with tempfile.TemporaryDirectory() as out:
        for name, obj in files.items():
            with open(os.path.join(out, name), "w") as f:
                json.dump(obj, f)
        run = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "gpu_summary.py"), out],
                             capture_output=True, text=True)
    if run.returncode != 0:
        raise AssertionError(f"gpu_summary.py failed:\n{run.stderr}")
    return run.stdout


def table_row(text, shape, tokens):
    """The summary table's line of one point."""
    return next(line for line in text.splitlines() if re.match(rf"\s+{re.escape(shape)}\s+{tokens}\s", line))


PEER = {"name": "triton_kernels matmul_ogs (vLLM 0.33.0)", "version": "vllm==0.33.0; triton 3.6.0; torch 2.11.0"}


class SummaryPeerColumn(unittest.TestCase):
    def test_peer_us_and_ratio_per_point(self):
        moe = {"gpu": "NVIDIA H200", "copy_tbps": 4.0, "bf16_tflops": 700, "peer": PEER,
               "rows": [moe_row("gpt-oss-120b", 1, 40.0, 64.0), moe_row("gpt-oss-120b", 8, 150.0, None)]}
        peer = {"peer": PEER, "available": True, "complete": True, "rows": [
            {"shape": "gpt-oss-120b", "tokens": 1, "us": 64.0, "rel_l2": 3.3e-3},
            {"shape": "gpt-oss-120b", "tokens": 8, "error": "OutOfMemoryError: no room"}]}
        text = summary({"bench_moe.json": moe, "peer.json": peer})
        self.assertIn("peer_us", text)
        self.assertIn("mx/peer", text)
        row1 = table_row(text, "gpt-oss-120b", 1)
        self.assertRegex(row1, r"\s64\.0\s+0\.62\s")  # 40 / 64
        row8 = table_row(text, "gpt-oss-120b", 8)
        self.assertRegex(row8, r"\s-\s+-\s")
        self.assertIn("peer did not run at gpt-oss-120b T=8: OutOfMemoryError: no room", text)
        self.assertIn("max 3.30e-03 (gpt-oss-120b T=1)", text)
        self.assertIn("vllm==0.33.0", text)
        self.assertNotIn("incomplete", text)

    def test_says_why_when_the_peer_did_not_run(self):
        moe = {"gpu": "NVIDIA H200", "copy_tbps": 4.0, "bf16_tflops": 700, "peer": None,
               "peer_reason": ".peer/triton_kernels is absent: run scripts/fetch_peer.sh",
               "rows": [moe_row("qwen3-30b-a3b", 1, 30.0, None)]}
        text = summary({"bench_moe.json": moe})
        self.assertIn("peer did not run: .peer/triton_kernels is absent: run scripts/fetch_peer.sh", text)
        row = table_row(text, "qwen3-30b-a3b", 1)
        self.assertRegex(row, r"\s-\s+-\s")

    def test_results_without_a_peer_field_say_so(self):
        # bench_moe.json of runs before the peer column existed
        moe = {"gpu": "NVIDIA H200", "copy_tbps": 4.0, "bf16_tflops": 700, "rows": [moe_row("kimi-k2", 1, 90.0, None)]}
        self.assertIn("peer did not run: no peer in this run", summary({"bench_moe.json": moe}))

    def test_incomplete_peer_run_is_reported(self):
        moe = {"gpu": "NVIDIA H200", "copy_tbps": 4.0, "bf16_tflops": 700, "peer": PEER,
               "rows": [moe_row("gpt-oss-20b", 1, 40.0, 50.0)]}
        peer = {"peer": PEER, "available": True, "complete": False,
                "rows": [{"shape": "gpt-oss-20b", "tokens": 1, "us": 50.0, "rel_l2": 2e-3}]}
        self.assertIn("peer run incomplete", summary({"bench_moe.json": moe, "peer.json": peer}))

    def test_a_torch_point_that_failed_is_a_dash_with_the_reason(self):
        # Kimi-K2 at T = 16384 does not fit torch's BF16 layer and its graphs in an H100's 80 GB.
        moe = {"gpu": "NVIDIA H100", "copy_tbps": 3.0, "bf16_tflops": 740, "peer": PEER,
               "rows": [moe_row("kimi-k2", 8192, 12500.0, 15000.0), dict(moe_row("kimi-k2", 16384, 22000.0, 26000.0),
                                                                         torch_bf16_us=None)]}
        torch = {"gpu": "NVIDIA H100", "copy_tbps": 3.0, "bf16_tflops": 740,
                 "rows": [{"shape": "kimi-k2", "tokens": 8192, "us": 25000.0}],
                 "failed": [{"shape": "kimi-k2", "tokens": 16384, "error": "OutOfMemoryError: CUDA out of memory."}]}
        text = summary({"bench_moe.json": moe, "torch.json": torch})
        row = table_row(text, "kimi-k2", 16384)
        self.assertRegex(row, r"%\s+-\s+-\s+26000\.0\s+0\.85\s")
        self.assertNotIn("0.00x", text)
        self.assertIn("torch did not run at kimi-k2 T=16384: OutOfMemoryError: CUDA out of memory.", text)
        self.assertNotIn("torch did not run at kimi-k2 T=8192", text)
        self.assertNotIn("not measured in this run", text)

    def test_no_torch_baseline_is_said_once(self):
        moe = {"gpu": "NVIDIA H100", "copy_tbps": 3.0, "peer": PEER,
               "rows": [dict(moe_row("qwen3-30b-a3b", 1, 24.0, 44.0), torch_bf16_us=None)]}
        text = summary({"bench_moe.json": moe})
        self.assertIn("torch BF16 baseline not measured in this run (no torch.json)", text)
        self.assertNotIn("torch did not run at", text)

    def test_peer_alone(self):
        peer = {"peer": None, "available": False, "reason": "no CUDA device", "rows": []}
        self.assertIn("peer did not run: no CUDA device", summary({"peer.json": peer}))


def ab_rows(times):
    return {"rows": [{"shape": s, "tokens": t, "us": us} for (s, t), us in times.items()]}


def ab_compare(files, *args):
    with tempfile.TemporaryDirectory() as d:
        for name, obj in files.items():
            with open(os.path.join(d, name), "w") as f:
                if isinstance(obj, str):
                    f.write(obj)
                else:
                    json.dump(obj, f)
        run = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "ab_compare.py"), d, *args],
                             capture_output=True, text=True)
        out = None
        if "--json" in args:
            path = args[args.index("--json") + 1]
            if os.path.exists(path):
                with open(path) as f:
                    out = json.load(f)
    return run, out


class AbCompare(unittest.TestCase):
    files = {
        # base: rounds 100 / 102 at T = 1 (spread 1.02), 50 / 50 at T = 8
        "base_1.json": ab_rows({("qwen3-30b-a3b", 1): 100.0, ("qwen3-30b-a3b", 8): 50.0}),
        "base_2.json": ab_rows({("qwen3-30b-a3b", 1): 102.0, ("qwen3-30b-a3b", 8): 50.0}),
        # new: T = 1 within the noise (0.99), T = 8 beyond it (0.90); ignored: other file names
        "new_1.json": ab_rows({("qwen3-30b-a3b", 1): 99.0, ("qwen3-30b-a3b", 8): 45.5}),
        "new_2.json": ab_rows({("qwen3-30b-a3b", 1): 99.5, ("qwen3-30b-a3b", 8): 45.0}),
        "ab.json": {"rows": []},
        "peer.json": {"rows": []},
    }

    def test_best_round_ratios_and_the_noise_mark(self):
        with tempfile.TemporaryDirectory() as tmp:
            run, out = ab_compare(self.files, "--json", os.path.join(tmp, "c.json"))
        self.assertEqual(run.returncode, 0, run.stderr)
        row1 = next(l for l in run.stdout.splitlines() if re.match(r"qwen3-30b-a3b\s+1\s", l))
        row8 = next(l for l in run.stdout.splitlines() if re.match(r"qwen3-30b-a3b\s+8\s", l))
        self.assertRegex(row1, r"\s100\.0\s+1\.020\s+0\.990 \s+1\.005")  # 99 / 100, unmarked
        self.assertRegex(row8, r"\s50\.0\s+1\.000\s+0\.900\*\s+1\.011")  # 45 / 50, marked
        self.assertIn("the largest spread (2.0%)", run.stdout)
        self.assertAlmostEqual(out["noise"], 0.02)
        self.assertEqual(out["base"], "base")
        self.assertEqual(out["rounds"], {"base": [1, 2], "new": [1, 2]})
        p8 = next(p for p in out["points"] if p["tokens"] == 8)
        self.assertAlmostEqual(p8["ratio"]["new"], 0.9)
        self.assertEqual(p8["us"]["new"], [45.5, 45.0])
        self.assertTrue(p8["beyond_noise"]["new"])

    def test_rounds_that_do_not_overlap_are_marked_under_an_erratic_point(self):
        # T = 1: base 100-101, new 97-98 (0.970, separated); T = 8: base 50-56 sets the noise
        # (12 %); T = 32: new 48-51 against base 49-50 (overlapping, unmarked); T = 64: new slower.
        files, rounds = {}, {
            "base": [(100.0, 50.0, 49.0, 20.0), (101.0, 56.0, 50.0, 20.2), (100.5, 53.0, 49.5, 20.1)],
            "new": [(97.0, 51.0, 48.0, 20.5), (98.0, 52.0, 51.0, 20.6), (97.5, 51.5, 50.0, 20.7)]}
        for b, rr in rounds.items():
            for r, us in enumerate(rr, 1):
                files[f"{b}_{r}.json"] = ab_rows({("qwen3-30b-a3b", t): u for t, u in zip((1, 8, 32, 64), us)})
        with tempfile.TemporaryDirectory() as tmp:
            run, out = ab_compare(files, "--json", os.path.join(tmp, "c.json"))
        self.assertEqual(run.returncode, 0, run.stderr)
        row = lambda t: next(l for l in run.stdout.splitlines() if re.match(rf"qwen3-30b-a3b\s+{t}\s", l))
        self.assertRegex(row(1), r"\s0\.970<\s")
        self.assertRegex(row(32), r"\s0\.980 \s")
        self.assertRegex(row(64), r"\s1\.025>\s")
        sep = {p["tokens"]: p["separated"]["new"] for p in out["points"]}
        self.assertEqual(sep, {1: -1, 8: 0, 32: 0, 64: 1})
        self.assertFalse(any(p["beyond_noise"]["new"] for p in out["points"]))
        # two rounds are too few to call: the same data cut to rounds 1-2 marks nothing
        two = {k: v for k, v in files.items() if not k.endswith("_3.json")}
        run2, _ = ab_compare(two)
        self.assertEqual(run2.returncode, 0, run2.stderr)
        self.assertNotRegex(run2.stdout, r"\d[<>]")

    def test_a_point_a_build_missed_is_a_dash(self):
        files = dict(self.files)
        files["new_1.json"] = ab_rows({("qwen3-30b-a3b", 1): 99.0})
        files["new_2.json"] = ab_rows({("qwen3-30b-a3b", 1): 99.5})
        run, _ = ab_compare(files)
        self.assertEqual(run.returncode, 0, run.stderr)
        row8 = next(l for l in run.stdout.splitlines() if re.match(r"qwen3-30b-a3b\s+8\s", l))
        self.assertRegex(row8, r"\s-\s+-$")

    def test_each_runs_clock_from_the_samples_inside_it(self):
        stamp = lambda t: time.strftime("%Y/%m/%d %H:%M:%S", time.localtime(t))
        t = 1_800_000_000  # whole seconds: the samples below fall inside or outside runs exactly
        files = dict(self.files)
        files["runs.txt"] = (f"base 1 {t} {t + 2}\nnew 1 {t + 3} {t + 5}\n"
                             f"base 2 {t + 6} {t + 8}\nnew 2 {t + 9} {t + 11}\n")
        files["clocks.csv"] = "".join([
            f"{stamp(t)}.100, 1980, 250.5, 40\n", f"{stamp(t + 1)}.100, 1980, 260.0, 41\n",
            f"{stamp(t + 1)}.600, 1700, 300.0, 41\n",   # base round 1: median 1980, lowest 1700
            f"{stamp(t + 2)}.500, 900, 80.0, 40\n",     # between runs: in no run
            f"{stamp(t + 4)}.000, 1755, [N/A], 42\n",   # new round 1: no power reading
            f"{stamp(t + 7)}.000, 1980, 255.0, 42\n",   # base round 2
            "garbage line\n"])                           # new round 2: no samples
        with tempfile.TemporaryDirectory() as tmp:
            run, out = ab_compare(files, "--json", os.path.join(tmp, "c.json"))
        self.assertEqual(run.returncode, 0, run.stderr)
        self.assertIn("SM clock per run (median / lowest MHz, highest W):", run.stdout)
        self.assertRegex(run.stdout, r"base\s+r1 1980/1700 300 W; r2 1980/1980 255 W")
        self.assertRegex(run.stdout, r"new\s+r1 1755/1755\n")
        self.assertEqual(out["clocks"]["new"], {"1": {"sm_mhz_median": 1755.0, "sm_mhz_min": 1755.0,
                                                      "power_w_max": None, "samples": 1}})

    def test_no_clock_files_no_clock_lines(self):
        run, out = ab_compare(self.files)
        self.assertEqual(run.returncode, 0, run.stderr)
        self.assertNotIn("SM clock", run.stdout)

    def test_unknown_base_and_empty_folder(self):
        run, _ = ab_compare(self.files, "--base", "old")
        self.assertEqual(run.returncode, 2)
        self.assertIn("--base: no old_<round>.json among the builds ['base', 'new']", run.stderr)
        run, _ = ab_compare({})
        self.assertEqual(run.returncode, 2)
        self.assertIn("no <build>_<round>.json", run.stderr)


FAKE_BENCH = """#!/usr/bin/env python3
import json, os, sys
a = sys.argv[1:]
calls = os.path.join(os.path.dirname(os.path.abspath(__file__)), "calls")
with open(calls, "a") as f:
    f.write(os.path.basename(__file__) + "\\n")
if "--l2-flush" in a:  # what ab_moe.sh passed on, one line per run
    with open(calls + ".flush", "a") as f:
        f.write(a[a.index("--l2-flush") + 1] + "\\n")
if os.path.basename(__file__) == "broken":
    sys.exit(3)
tokens = [int(t) for t in a[a.index("--tokens") + 1].split(",")]
us = {"base": 100.0, "new": 80.0}[os.path.basename(__file__)]
__import__("time").sleep(0.2)  # long enough for a stand-in nvidia-smi to sample the run
rows = [{"shape": s, "tokens": t, "us": us * t} for s in a[a.index("--shapes") + 1].split(",") for t in tokens]
json.dump({"rows": rows}, open(a[a.index("--json") + 1], "w"))
"""


# A stand-in for `nvidia-smi --query-gpu=... --format=csv,noheader,nounits -lms 100`: a sample line
# every 20 ms until it is killed.
FAKE_SMI = """#!/usr/bin/env python3
import sys, time
while True:
    t = time.time()
    print(time.strftime("%Y/%m/%d %H:%M:%S", time.localtime(t)) + ".%03d, 1980, 250.0, 40" % (t % 1 * 1000), flush=True)
    time.sleep(0.02)
"""


class AbScript(unittest.TestCase):
    def run_ab(self, d, *args, path=None):
        env = dict(os.environ, PATH=path) if path else None
        return subprocess.run(["bash", os.path.join(ROOT, "scripts", "ab_moe.sh"), *args], capture_output=True,
                              text=True, cwd=d, env=env)

    def fake(self, d, name):
        path = os.path.join(d, name)
        with open(path, "w") as f:
            f.write(FAKE_BENCH)
        os.chmod(path, 0o755)
        return path

    def test_rounds_alternate_and_the_table_comes_last(self):
        with tempfile.TemporaryDirectory() as d:
            base, new = self.fake(d, "base"), self.fake(d, "new")
            out = os.path.join(d, "ab")
            run = self.run_ab(d, "--rounds", "2", "--shapes", "qwen3-30b-a3b", "--tokens", "1,8", "--out", out,
                              f"base={base}", f"new={new}")
            self.assertEqual(run.returncode, 0, run.stderr)
            with open(os.path.join(d, "calls")) as f:  # round 2 starts one build further along
                self.assertEqual(f.read().split(), ["base", "new", "new", "base"])
            self.assertTrue(os.path.exists(os.path.join(out, "ab.json")))
            row8 = next(l for l in run.stdout.splitlines() if re.match(r"qwen3-30b-a3b\s+8\s", l))
            self.assertRegex(row8, r"\s800\.0\s+1\.000\s+0\.800\*")

    def test_l2_flush_reaches_every_run(self):
        with tempfile.TemporaryDirectory() as d:
            base, new = self.fake(d, "base"), self.fake(d, "new")
            run = self.run_ab(d, "--rounds", "2", "--shapes", "qwen3-30b-a3b", "--tokens", "8", "--out",
                              os.path.join(d, "ab"), f"base={base}", f"new={new}")
            self.assertEqual(run.returncode, 0, run.stderr)
            self.assertFalse(os.path.exists(os.path.join(d, "calls.flush")))  # bench_moe's default
            run = self.run_ab(d, "--rounds", "2", "--l2-flush", "clean", "--shapes", "qwen3-30b-a3b", "--tokens", "8",
                              "--out", os.path.join(d, "ab2"), f"base={base}", f"new={new}")
            self.assertEqual(run.returncode, 0, run.stderr)
            with open(os.path.join(d, "calls.flush")) as f:
                self.assertEqual(f.read().split(), ["clean"] * 4)

    def test_clock_sampled_during_each_run(self):
        with tempfile.TemporaryDirectory() as d:
            base, new = self.fake(d, "base"), self.fake(d, "new")
            smi_dir = os.path.join(d, "bin")
            os.mkdir(smi_dir)
            with open(os.path.join(smi_dir, "nvidia-smi"), "w") as f:
                f.write(FAKE_SMI)
            os.chmod(os.path.join(smi_dir, "nvidia-smi"), 0o755)
            out = os.path.join(d, "ab")
            run = self.run_ab(d, "--rounds", "1", "--shapes", "qwen3-30b-a3b", "--tokens", "1", "--out", out,
                              f"base={base}", f"new={new}", path=smi_dir + os.pathsep + os.environ["PATH"])
            self.assertEqual(run.returncode, 0, run.stderr)
            with open(os.path.join(out, "runs.txt")) as f:
                self.assertEqual([l.split()[:2] for l in f], [["base", "1"], ["new", "1"]])
            self.assertRegex(run.stdout, r"base\s+r1 1980/1980 250 W")
            self.assertRegex(run.stdout, r"new\s+r1 1980/1980 250 W")
            with open(os.path.join(out, "ab.json")) as f:
                self.assertGreater(json.load(f)["clocks"]["base"]["1"]["samples"], 0)

    def test_a_failing_build_is_reported_and_the_rest_compared(self):
        # Without nvidia-smi on PATH (even on a GPU machine): the script says the clock is not sampled.
        no_smi = os.pathsep.join(p for p in os.environ["PATH"].split(os.pathsep)
                                 if not os.path.exists(os.path.join(p, "nvidia-smi")))
        with tempfile.TemporaryDirectory() as d:
            base, broken = self.fake(d, "base"), self.fake(d, "broken")
            run = self.run_ab(d, "--rounds", "1", "--tokens", "1", "--out", os.path.join(d, "ab"), f"base={base}",
                              f"broken={broken}", path=no_smi)
            self.assertEqual(run.returncode, 1)
            self.assertIn("broken failed in round 1", run.stderr)
            self.assertRegex(run.stdout, r"gpt-oss-120b\s+1\s+100\.0\s+1\.000\s+-\s+-")
            self.assertIn("no results for build broken", run.stdout)
            self.assertIn("nvidia-smi not found: the SM clock is not sampled", run.stderr)

    def test_time_limit_stops_starting_runs_and_still_compares(self):
        with tempfile.TemporaryDirectory() as d:
            base, new = self.fake(d, "base"), self.fake(d, "new")
            out = os.path.join(d, "ab")
            # Each stand-in run takes at least 0.2 s: 10 runs cannot fit in 1 s, one always starts.
            run = self.run_ab(d, "--rounds", "5", "--time-limit", "1", "--shapes", "qwen3-30b-a3b", "--tokens", "1",
                              "--out", out, f"base={base}", f"new={new}")
            self.assertEqual(run.returncode, 0, run.stderr)
            with open(os.path.join(d, "calls")) as f:
                calls = f.read().split()
            self.assertGreaterEqual(len(calls), 1)
            self.assertLess(len(calls), 10)
            self.assertRegex(run.stderr, r"--time-limit 1 s reached in round \d: no more runs")
            self.assertTrue(os.path.exists(os.path.join(out, "ab.json")))
            self.assertRegex(run.stdout, r"qwen3-30b-a3b\s+1\s+100\.0")

    def test_usage_errors(self):
        with tempfile.TemporaryDirectory() as d:
            base = self.fake(d, "base")
            for args, message in [
                ([f"base={base}"], "name at least two builds"),
                (["--time-limit", "soon", f"base={base}", f"new={base}"],
                 "--time-limit: expected a positive number of seconds, got 'soon'"),
                ([f"base={base}", f"base={base}"], "build name 'base' given twice"),
                ([f"base={base}", "new=/no/such/bench_moe"], "'/no/such/bench_moe' is not an executable bench_moe"),
                ([f"base={base}", f"a/b={base}"], "build name 'a/b'"),
                (["--rounds", "0", f"base={base}", f"new={base}"], "--rounds: expected a positive integer, got '0'"),
                (["--frobnicate"], "unknown argument '--frobnicate'"),
                (["--l2-flush", "wet", f"base={base}", f"new={base}"], "--l2-flush: expected dirty or clean, got 'wet'"),
            ]:
                run = self.run_ab(d, *args)
                self.assertEqual(run.returncode, 2, args)
                self.assertIn(message, run.stderr, args)



# The source page ncu writes for `--page source --csv --print-source sass`: one block per kernel
# (its name, a header, one row per instruction), columns as Nsight Compute 2025 names them.
SOURCE_CSV = "\n".join([
    '"Kernel Name","void moe_gemm_prefill_kernel<prefill_tile<64, 4, 9, 4, 2>, 1>(gemm_weights)",',
    '"Address","Source","Warp Stall Sampling (All Samples)","Warp Stall Sampling (Not-issued Samples)",'
    '"stall_long_sb","stall_wait","stall_wait (Not Issued)","stall_selected"',
    '"0x7f00","@!P0  BRA 0x7f40","40","40","40","0","0","0"',
    '"0x7f10","UIADD3 UR18, UR20, 0x1, URZ","30","20","0","20","5","10"',
    '"0x7f20","ULEA UR19, UR20, UR16, 0x3","10","10","0","10","0","0"',
    '"0x7f30","HGMMA.64x64x16.F32.BF16 R24, R56, gdesc[UR16], R24","20","10","0","10","0","10"',
    '"0x7f40","EXIT","0","0","0","0","0","0"',
    '"Kernel Name","void combine_kernel(long)",',
    '"Address","Source","Warp Stall Sampling (All Samples)","stall_long_sb"',
    '"0x100","LDG.E R2, [R4.64]","5","5"',
])

# A stand-in for ncu: writes the CSV ncu writes for `--csv --print-units base --metrics
# gpu__time_duration.sum` (one forward and the start of the next), or fails when the point's shape
# is "broken"; with --set full it records the call and writes a report file; --page source prints
# SOURCE_CSV.
FAKE_NCU = """#!/usr/bin/env python3
import os, sys
SOURCE_CSV = """ + repr(SOURCE_CSV) + """
a = sys.argv[1:]
with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "ncu_calls"), "a") as f:
    f.write(" ".join(a) + "\\n")
if "--import" in a and a[a.index("--page") + 1] == "source":
    print(SOURCE_CSV)
    sys.exit(0)
if "--import" in a:
    print("  Duration  nsecond  12,058,100")
    sys.exit(0)
if a[a.index("--shapes") + 1] == "broken":
    print("==ERROR== the application returned an error code (1)")
    sys.exit(1)
if "--set" in a:
    open(a[a.index("-o") + 1] + ".ncu-rep", "w").write("report")
    sys.exit(0)
print("==PROF== Connected to process 1 (bench_moe)")
print('"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size",'
      '"Device","CC","Section Name","Metric Name","Metric Unit","Metric Value"')
kernels = [("void unnamed>::route_kernel<4>(const void *, bool, routing_config)", "44,768"),
           ("unnamed>::schedule_kernel(int, int, long, moe_workspace)", "4,928"),
           ("unnamed>::gather_sorted_rows_kernel(const unsigned short *, int, long)", "226,016"),
           ("void moe_gemm_prefill_kernel<prefill_tile<176, 4, 5, 3, 2>, 1>(gemm_weights)", "1,204,928"),
           ("void moe_gemm_prefill_kernel<prefill_tile<176, 4, 5, 3, 2>, 1>(gemm_weights)", "790,688"),
           ("unnamed>::combine_kernel(long, int, long, const int *)", "196,064"),
           ("void unnamed>::route_kernel<4>(const void *, bool, routing_config)", "43,392")]
for i, (k, ns) in enumerate(kernels):
    print(f'"{i}","1","bench_moe","h","{k}","1","7","(128, 1, 1)","(64, 1, 1)","0","9.0",'
          f'"Command line profiler metrics","gpu__time_duration.sum","nsecond","{ns}"')
"""


class ProfileScript(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        d = self.dir.name
        for name, text in (("ncu", FAKE_NCU), ("bench_moe", "#!/bin/sh\nexit 0\n")):
            with open(os.path.join(d, name), "w") as f:
                f.write(text)
            os.chmod(os.path.join(d, name), 0o755)
        self.env = dict(os.environ, PATH=d + os.pathsep + os.environ["PATH"])

    def tearDown(self):
        self.dir.cleanup()

    def run_profile(self, *args):
        d = self.dir.name
        return subprocess.run(["bash", os.path.join(ROOT, "scripts", "profile_moe.sh"), "--bin",
                               os.path.join(d, "bench_moe"), "--out", os.path.join(d, "prof"), *args],
                              capture_output=True, text=True, env=self.env)

    def test_one_forward_per_point_with_its_sum(self):
        run = self.run_profile("qwen3-30b-a3b:16384")
        self.assertEqual(run.returncode, 0, run.stderr)
        self.assertRegex(run.stdout, r"route_kernel<4>\s+44\.8 us")
        self.assertRegex(run.stdout, r"moe_gemm_prefill_kernel<prefill_tile<176, 4, 5, 3, 2>, 1>\s+790\.7 us")
        self.assertRegex(run.stdout, r"sum\s+2467\.4 us")
        self.assertNotIn("43.4", run.stdout)  # the next forward's first kernel
        with open(os.path.join(self.dir.name, "prof", "qwen3-30b-a3b_16384.json")) as f:
            out = json.load(f)
        self.assertEqual([k for k, _ in out["kernels"]][:3], ["route_kernel<4>", "schedule_kernel",
                                                                "gather_sorted_rows_kernel"])
        self.assertEqual(len(out["kernels"]), 6)
        with open(os.path.join(self.dir.name, "ncu_calls")) as f:
            call = f.read()
        self.assertIn("--shapes qwen3-30b-a3b --tokens 16384 --iters 1", call)
        self.assertIn("--launch-count 10", call)

    def test_full_profile_of_the_matching_kernels(self):
        run = self.run_profile("--full", "moe_gemm_prefill", "kimi-k2:2048")
        self.assertEqual(run.returncode, 0, run.stderr)
        self.assertTrue(os.path.exists(os.path.join(self.dir.name, "prof", "kimi-k2_2048_full.ncu-rep")))
        self.assertTrue(os.path.exists(os.path.join(self.dir.name, "prof", "kimi-k2_2048_full_source.csv")))
        self.assertIn("Duration", run.stdout)
        self.assertIn("reasons: long_sb 40.0%, wait 40.0%, selected 20.0%", run.stdout)
        self.assertTrue(os.path.exists(os.path.join(self.dir.name, "prof", "kimi-k2_2048_full_source.json")))
        with open(os.path.join(self.dir.name, "ncu_calls")) as f:
            calls = f.read()
        self.assertIn("--set full --import-source yes --clock-control none --kernel-name regex:moe_gemm_prefill", calls)
        self.assertIn("--page source --csv --print-source sass", calls)

    def test_a_failing_point_is_reported_and_the_rest_profiled(self):
        run = self.run_profile("broken:8", "gpt-oss-120b:2048")
        self.assertEqual(run.returncode, 1)
        self.assertIn("profile_moe: broken T=8 failed", run.stderr)
        self.assertTrue(os.path.exists(os.path.join(self.dir.name, "prof", "gpt-oss-120b_2048.json")))

    def test_usage_errors(self):
        for args, message in [([], "name at least one point SHAPE:T"),
                              (["qwen3-30b-a3b"], "unknown argument 'qwen3-30b-a3b'"),
                              (["qwen3-30b-a3b:0"], "T must be a positive integer"),
                              (["Bad_Shape:8"], "expected SHAPE:T"),
                              (["--full"], "--full needs a value")]:
            run = self.run_profile(*args)
            self.assertEqual(run.returncode, 2, args)
            self.assertIn(message, run.stderr, args)
        run = subprocess.run(["bash", os.path.join(ROOT, "scripts", "profile_moe.sh"), "--bin", "/no/such/bench_moe",
                              "qwen3-30b-a3b:8"], capture_output=True, text=True, env=self.env)
        self.assertEqual(run.returncode, 2)
        self.assertIn("'/no/such/bench_moe' is not an executable bench_moe", run.stderr)


class NcuSource(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.csv = os.path.join(self.dir.name, "source.csv")
        with open(self.csv, "w") as f:
            f.write(SOURCE_CSV + "\n")

    def tearDown(self):
        self.dir.cleanup()

    def run_tool(self, *args):
        return subprocess.run([sys.executable, os.path.join(ROOT, "bench", "ncu_source.py"), *args],
                              capture_output=True, text=True)

    def test_shares_by_reason_opcode_and_instruction(self):
        out = os.path.join(self.dir.name, "s.json")
        run = self.run_tool(self.csv, "--top", "2", "--json", out)
        self.assertEqual(run.returncode, 0, run.stderr)
        with open(out) as f:
            gemm, combine = json.load(f)
        self.assertEqual(gemm["samples"], 100)
        # "(Not Issued)" columns are a subset of their reason's samples, not a reason of their own.
        self.assertEqual(gemm["reasons"], [["long_sb", 40.0], ["wait", 40.0], ["selected", 20.0]])
        # Predicates are not opcodes; uniform-datapath opcodes are one kind.
        self.assertEqual(gemm["kinds"], [["BRA", 40.0], ["U*", 40.0], ["HGMMA", 20.0]])
        self.assertEqual([t["source"] for t in gemm["top"]], ["@!P0  BRA 0x7f40", "UIADD3 UR18, UR20, 0x1, URZ"])
        self.assertEqual(gemm["top"][1]["reasons"], [["wait", 20.0], ["selected", 10.0]])
        self.assertEqual(combine["kinds"], [["LDG", 100.0]])
        self.assertIn("combine_kernel", run.stdout)

    def test_a_file_without_source_rows_fails(self):
        with open(self.csv, "w") as f:
            f.write("==ERROR== could not open the report\n")
        run = self.run_tool(self.csv)
        self.assertEqual(run.returncode, 1)
        self.assertIn("no source rows", run.stderr)


# cuobjdump -sass output in miniature: two kernels, one a tile that gained a defaulted flag; the
# tile's outer loop (0x0010..0x0080) holds the inner one (0x0020..0x0060), which holds the HGMMA.
def sass(name, inner_extra):
    body = ["        /*0000*/                   LDC R1, c[0x0][0x28] ;",
            "        /*0010*/                   MOV R2, RZ ;",
            "        /*0020*/                   LOP3.LUT R3, R2, 0xf, RZ, 0xc0, !PT ;"]
    body += [f"        /*{0x30 + 0x10 * i:04x}*/                   {ins} ;" for i, ins in enumerate(inner_extra)]
    n = 0x30 + 0x10 * len(inner_extra)
    body += [f"        /*{n:04x}*/                   HGMMA.64x64x16.F32.BF16 R24, R128, gdesc[UR16], R24 ;",
             f"        /*{n + 0x10:04x}*/              @!P0 BRA 0x20 ;",
             f"        /*{n + 0x20:04x}*/                   IADD3 R2, R2, 0x1, RZ ;",
             f"        /*{n + 0x30:04x}*/              @!P1 BRA 0x10 ;",
             f"        /*{n + 0x40:04x}*/                   EXIT ;"]
    return "\n".join([f"\tFunction : {name}", "\t.headerflags\t@\"EF_CUDA_SM90\""] + body) + "\n"


TILE_OLD = "_ZN5mxmoe4cuda4sm9023moe_gemm_prefill_kernelINS1_12prefill_tileILi64ELi3ELi3ELi4ELi2ELi4EEELb1EEEvv"
TILE_NEW = "_ZN5mxmoe4cuda4sm9023moe_gemm_prefill_kernelINS1_12prefill_tileILi64ELi3ELi3ELi4ELi2ELi4ELb1EEELb1EEEvv"


class SassLoops(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.new = os.path.join(self.dir.name, "new.txt")
        self.base = os.path.join(self.dir.name, "base.txt")
        with open(self.new, "w") as f:
            f.write(sass(TILE_NEW, ["UISETP.GE.AND UP0, UPT, UR12, 0x7, UPT", "PLOP3.LUT P0, PT, PT, PT, UP0, 0x80, 0x0"]))
            f.write(sass("_Z14combine_kernelv", ["FADD R4, R4, R5"]))
        with open(self.base, "w") as f:
            f.write(sass(TILE_OLD, ["ISETP.GE.AND P0, PT, R12, 0x7, PT"]))

    def tearDown(self):
        self.dir.cleanup()

    def run_tool(self, *args):
        return subprocess.run([sys.executable, os.path.join(ROOT, "bench", "sass_loops.py"), *args],
                              capture_output=True, text=True)

    @unittest.skipUnless(shutil.which("c++filt"), "no c++filt: kernels are paired by their demangled names")
    def test_innermost_loop_paired_with_the_base_tile(self):
        run = self.run_tool("--sass", self.new, "--base-sass", self.base)
        self.assertEqual(run.returncode, 0, run.stderr)
        lines = run.stdout.splitlines()
        # The inner loop: LOP3, the two added instructions, HGMMA, BRA = 5 (base: 4); the outer one
        # adds MOV, IADD3 and its BRA: 8 (7); the kernel 10 (9).
        self.assertRegex(lines[0], r"^\s*5 \[8\] \(base 4 \[7\]\)\s+10 \(base 9\)\s+\S*moe_gemm_prefill_kernel")
        self.assertIn("ISETP.GE.AND 1->0", lines[1])
        self.assertIn("UISETP.GE.AND 0->1", lines[1])
        self.assertIn("PLOP3.LUT 0->1", lines[1])
        self.assertNotIn("combine", run.stdout)  # not a GEMM (--kernels moe_gemm by default)

    @unittest.skipUnless(shutil.which("c++filt"), "no c++filt: kernels are paired by their demangled names")
    def test_path_leaves_out_the_other_widths_wgmma_groups(self):
        # Inner loop: LOP3, a 32-wide group (ARRIVE, UMOV, closing HGMMA, its branch out), a 64-wide
        # group (ARRIVE, closing HGMMA), the fixture's unclosed HGMMA and the loop branch: 9. At the
        # widest width (64) a pass skips the 32-wide group's 4: path 5.
        with open(self.new, "w") as f:
            f.write(sass(TILE_NEW, ["WARPGROUP.ARRIVE", "UMOV UR18, UR23",
                                    "HGMMA.64x32x16.F32.BF16 R24, R68, gdesc[UR16], R24, gsb0", "BRA 0x200",
                                    "WARPGROUP.ARRIVE", "HGMMA.64x64x16.F32.BF16 R24, R68, gdesc[UR16], R24, gsb0"]))
        run = self.run_tool("--sass", self.new, "--base-sass", self.base)
        self.assertEqual(run.returncode, 0, run.stderr)
        line = run.stdout.splitlines()[0]
        self.assertRegex(line, r"^\s*9 \[12\] \(base 4 \[7\]\)")
        self.assertTrue(line.endswith("path 5@64 (base -)"), line)
        run = self.run_tool("--sass", self.new)
        self.assertTrue(run.stdout.splitlines()[0].endswith("path 5@64"), run.stdout)

    def test_other_kernels_and_no_match(self):
        run = self.run_tool("--sass", self.new, "--kernels", "combine")
        self.assertEqual(run.returncode, 0, run.stderr)
        self.assertRegex(run.stdout, r"^\s*4 \[7\]\s+9\s+\S*combine_kernel")
        run = self.run_tool("--sass", self.new, "--kernels", "no_such_kernel")
        self.assertEqual(run.returncode, 1)
        self.assertIn("no kernel matches", run.stderr)

    def test_usage_errors(self):
        self.assertEqual(self.run_tool().returncode, 2)
        run = self.run_tool("--sass", os.path.join(self.dir.name, "missing.txt"))
        self.assertEqual(run.returncode, 2)
        self.assertIn("missing.txt", run.stderr)
        run = self.run_tool("/no/such/binary", "--cuobjdump", "/no/such/cuobjdump")
        self.assertEqual(run.returncode, 2)

    def test_missing_cuobjdump_names_where_to_get_it(self):
        if os.path.exists("/usr/local/cuda/bin/cuobjdump"):
            self.skipTest("this machine's CUDA toolkit has cuobjdump, so the tool always finds one")
        env = {k: v for k, v in os.environ.items() if k != "CUOBJDUMP"}
        env["PATH"] = os.path.dirname(sys.executable)
        run = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "sass_loops.py"), "/no/such/binary"],
                             capture_output=True, text=True, env=env)
        self.assertEqual(run.returncode, 2)
        self.assertIn("cuobjdump not found", run.stderr)
        self.assertIn("pip download --no-deps nvidia-cuda-cuobjdump", run.stderr)


class SassWalk(unittest.TestCase):
    """--walk: the instructions one warp issues along one path of one kernel."""

    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.file = os.path.join(self.dir.name, "k.txt")
        # 0x00 LDC, 0x10 MOV, 0x20 LOP3, 0x30 @P2 BRA 0x60, 0x40 FADD, 0x50 FMUL, 0x60 HGMMA,
        # 0x70 @!P0 BRA 0x20, 0x80 IADD3, 0x90 @!P1 BRA 0x10, 0xa0 EXIT
        with open(self.file, "w") as f:
            f.write(sass(TILE_NEW, ["@P2 BRA 0x60", "FADD R4, R4, R5", "FMUL R4, R4, R5"]))
            f.write(sass("_Z14combine_kernelv", ["FADD R4, R4, R5"]))

    def tearDown(self):
        self.dir.cleanup()

    def run_tool(self, *args, kernels="prefill"):
        return subprocess.run([sys.executable, os.path.join(ROOT, "bench", "sass_loops.py"), "--sass", self.file,
                               "--kernels", kernels, *args], capture_output=True, text=True)

    def test_branches_fall_through_unless_taken(self):
        run = self.run_tool("--walk", "10:90")
        self.assertEqual(run.returncode, 0, run.stderr)
        self.assertIn(": 9 instructions", run.stdout)  # 0x10 .. 0x90, no branch taken
        self.assertIn("FADD 1", run.stdout)
        run = self.run_tool("--walk", "0x10:0x90:0x30")
        self.assertEqual(run.returncode, 0, run.stderr)
        self.assertIn("taken at 0x30: 7 instructions", run.stdout)  # FADD and FMUL skipped
        self.assertNotIn("FADD", run.stdout)

    def test_a_path_that_loops_or_leaves_is_an_error(self):
        run = self.run_tool("--walk", "10:90:70")  # 0x70 jumps back to 0x20
        self.assertEqual(run.returncode, 2)
        self.assertIn("comes back to 0x20", run.stderr)
        run = self.run_tool("--walk", "80:a0:90")  # 0x90 jumps to 0x10, which falls through to 0x80 again
        self.assertEqual(run.returncode, 2)
        self.assertIn("comes back to 0x80", run.stderr)
        run = self.run_tool("--walk", "80:a0")  # IADD3, the branch not taken, EXIT
        self.assertEqual(run.returncode, 0, run.stderr)
        self.assertIn(": 3 instructions", run.stdout)
        run = self.run_tool("--walk", "10:95")
        self.assertEqual(run.returncode, 2)
        self.assertIn("0x95 is not an instruction", run.stderr)

    def test_usage(self):
        self.assertEqual(self.run_tool("--walk", "10").returncode, 2)
        self.assertEqual(self.run_tool("--walk", "10:zz").returncode, 2)
        run = self.run_tool("--walk", "10:90", kernels=".")  # two kernels match
        self.assertEqual(run.returncode, 1)
        self.assertIn("matches 2", run.stderr)
        run = self.run_tool("--walk", "10:90", "--base-sass", self.file)
        self.assertEqual(run.returncode, 2)


if __name__ == "__main__":
    unittest.main(verbosity=2)
