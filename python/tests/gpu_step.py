#!/usr/bin/env python3
"""The Python half of the GPU run (scripts/gpu_all.sh, step `python`): the CUDA tests of
python/tests (`pytest -m cuda`: CUDA against the CPU backend and the models' formulation, graph
capture replayed with new inputs, the current stream and device, checkpoints on CUDA, the Hugging
Face models at the CUDA tolerance, torch.compile) and the overhead benchmark
(python/benchmarks/overhead.py --device cuda --tokens 1), from a build tree without installing
(build/lib holds _hotpath.abi3.so and libmxmoe_torch.so next to the library):

    MXMOE_LIBRARY=build/lib/libmxmoe_c.so PYTHONPATH=python python3 python/tests/gpu_step.py --out $OUT

Writes two files to --out: python.json (environment, test counts, failures and skip reasons, the
benchmark's numbers) and python.log (everything pytest and the benchmark printed); prints a short
summary last. Without a usable GPU every CUDA test reports skipped with the reason and the
benchmark prints SKIPPED; the step then passes with status "skipped". Exit code 1 when a test
failed, the benchmark failed, or a part ran past its time limit.

Also a pytest plugin (`-p gpu_step`): with $MXMOE_GPU_STEP_RESULTS set it writes each test's
outcome there as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
if str(REPO / "python") not in sys.path:  # the source package, as the children get it
    sys.path.insert(0, str(REPO / "python"))

# ---- the pytest plugin -------------------------------------------------------------------------

_results: list[dict] = []


def pytest_runtest_logreport(report):
    if report.when == "call" or report.outcome != "passed":  # setup/teardown only when they did not pass
        entry = {"test": report.nodeid, "when": report.when, "outcome": report.outcome,
                 "seconds": round(report.duration, 3)}
        if report.skipped and isinstance(report.longrepr, tuple):
            entry["reason"] = report.longrepr[2].removeprefix("Skipped: ")
        elif report.failed:
            entry["message"] = str(report.longrepr)[-2000:]
        if hasattr(report, "wasxfail"):
            entry["outcome"] = "xfailed" if report.skipped else "xpassed"
        _results.append(entry)


def pytest_sessionfinish(session, exitstatus):
    path = os.environ.get("MXMOE_GPU_STEP_RESULTS")
    if path:
        Path(path).write_text(json.dumps({"exitstatus": int(exitstatus), "results": _results}))


# ---- the step ------------------------------------------------------------------------------------


def environment() -> dict:
    env = {"python": sys.version.split()[0], "library": os.environ.get("MXMOE_LIBRARY", "(installed package)")}
    try:
        import torch

        env["torch"] = torch.__version__
        env["torch_cuda"] = torch.cuda.is_available()
        env["torch_devices"] = torch.cuda.device_count() if env["torch_cuda"] else 0
    except Exception as e:  # noqa: BLE001 - reported, not raised
        env["torch"] = f"unavailable: {e}"
    try:
        import transformers

        env["transformers"] = transformers.__version__
    except Exception as e:  # noqa: BLE001
        env["transformers"] = f"unavailable: {e}"
    try:
        import mxmoe

        env["mxmoe"] = mxmoe.__version__
        env["built_with_cuda"] = mxmoe.cuda.built_with_cuda()
        env["cuda_available"] = mxmoe.cuda.available()
        env["cuda_unavailable_because"] = mxmoe.cuda.why_unavailable()
        env["device"] = mxmoe.cuda.device_name() if env["cuda_available"] else None
        import mxmoe.torch

        env["native_op"] = mxmoe.torch.NATIVE_OP  # torch.ops.mxmoe.moe_forward's C++ kernel
        env["native_op_reason"] = mxmoe.torch.NATIVE_OP_REASON
    except Exception as e:  # noqa: BLE001
        env["mxmoe"] = f"import failed: {e}"
    return env


def run(cmd: list[str], timeout: float, log, env: dict) -> tuple[int | None, float]:
    """Runs cmd with its output to the log and stdout; (exit code or None on timeout, seconds)."""
    log.write(f"$ {' '.join(cmd)}\n")
    log.flush()
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=REPO)
    deadline = t0 + timeout
    rc = None
    try:
        for line in proc.stdout:  # noqa: SIM111
            log.write(line)
            sys.stdout.write(line)
            if time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(cmd, timeout)
        rc = proc.wait(timeout=max(1.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        log.write(f"*** timed out after {timeout:.0f} s\n")
    log.flush()
    return rc, time.monotonic() - t0


def summarize_tests(results: list[dict]) -> dict:
    counts: dict[str, int] = {}
    reasons: dict[str, int] = {}
    for r in results:
        counts[r["outcome"]] = counts.get(r["outcome"], 0) + 1
        if r["outcome"] == "skipped":
            reasons[r.get("reason", "?")] = reasons.get(r.get("reason", "?"), 0) + 1
    slowest = sorted((r for r in results if r["when"] == "call"), key=lambda r: -r["seconds"])[:5]
    return {"counts": counts, "failures": [r for r in results if r["outcome"] in ("failed", "xpassed")],
            "skip_reasons": reasons, "slowest": [(r["test"], r["seconds"]) for r in slowest]}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=os.environ.get("OUT", "gpu-out"))
    p.add_argument("--pytest-timeout", type=float, default=150.0)
    p.add_argument("--bench-timeout", type=float, default=60.0)
    args = p.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    env = dict(os.environ)
    if env.get("MXMOE_LIBRARY"):  # the children run from the repository root
        env["MXMOE_LIBRARY"] = os.path.abspath(env["MXMOE_LIBRARY"])
    env["PYTHONPATH"] = os.pathsep.join([str(REPO / "python"), str(HERE)] +
                                        ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    env["PYTHONUNBUFFERED"] = "1"
    report: dict = {"environment": environment()}
    with open(out / "python.log", "w") as log, tempfile.TemporaryDirectory() as tmp:
        log.write(json.dumps(report["environment"], indent=1) + "\n")
        results_path = Path(tmp) / "results.json"
        env["MXMOE_GPU_STEP_RESULTS"] = str(results_path)
        rc, seconds = run([sys.executable, "-m", "pytest", str(HERE), "-m", "cuda", "-q", "-rs", "-p", "no:cacheprovider",
                           "-p", "gpu_step", "--durations=5"], args.pytest_timeout, log, env)
        results = json.loads(results_path.read_text())["results"] if results_path.exists() else []
        report["tests"] = {"exit_code": rc, "seconds": round(seconds, 1), **summarize_tests(results)}
        bench_json = Path(tmp) / "overhead.json"
        brc, bseconds = run([sys.executable, str(REPO / "python" / "benchmarks" / "overhead.py"), "--device", "cuda",
                             "--tokens", "1", "--json", str(bench_json)], args.bench_timeout, log, env)
        report["overhead"] = {"exit_code": brc, "seconds": round(bseconds, 1),
                              **(json.loads(bench_json.read_text()) if bench_json.exists() else {})}
    counts = report["tests"]["counts"]
    tests_ok = rc == 0 and not report["tests"]["failures"]
    bench_ok = brc == 0 and ("us_per_call" in report["overhead"] or "skipped" in report["overhead"])
    ran = counts.get("passed", 0) > 0 or "us_per_call" in report["overhead"]
    report["status"] = "failed" if not (tests_ok and bench_ok) else "passed" if ran else "skipped"
    report["seconds"] = round(time.monotonic() - t0, 1)
    (out / "python.json").write_text(json.dumps(report, indent=1))

    print(f"\n=== Python on the GPU: {report['status']} in {report['seconds']} s ===")
    print("tests: " + ", ".join(f"{n} {k}" for k, n in sorted(counts.items())) +
          (f" (pytest exit {rc})" if rc not in (0, None) else " (timed out)" if rc is None else ""))
    for f in report["tests"]["failures"]:
        print(f"  FAILED {f['test']}")
    for reason, n in report["tests"]["skip_reasons"].items():
        print(f"  skipped {n}: {reason}")
    o = report["overhead"]
    if "us_per_call" in o:
        us, added = o["us_per_call"], o["added_us"]
        print(f"overhead at T = 1 ({o['preset']}, {o.get('gpu')}): C++ call {us['cxx']:.2f} us; added by "
              + ", ".join(f"{k} {v:+.2f}" for k, v in added.items()) + f" us; GPU {o['gpu_us_per_forward']:.1f} us")
    else:
        print(f"overhead: {o['skipped'] if 'skipped' in o else 'failed (exit %s)' % o.get('exit_code')}")
    return 0 if report["status"] != "failed" else 1


if __name__ == "__main__":
    sys.exit(main())
