#!/usr/bin/env bash
# Measures checkpoint conversion as a user meets it: the rate at which the input is read (`cat`,
# from the page cache after a first read), then `mxmoe quantize` on each device — wall time, GB/s
# of input, peak RSS (getrusage of the child) — and writes everything as JSON.
#
#   scripts/bench_convert.sh [--bin DIR] [--file PATH] [--size-gb G] [--devices "cpu cuda"]
#                            [--rule even] [--json OUT.json] [--keep]
# --bin: where mxmoe and make_checkpoint are (default build/bin). --file: the BF16 checkpoint,
# written by make_checkpoint (gpt-oss layout, E = 32, H = I = 2880) when absent (default
# /tmp/mxmoe-bench-bf16.safetensors, --size-gb 6). The output goes next to it and is removed
# afterwards; --keep keeps the input.
set -euo pipefail

bin=build/bin file=/tmp/mxmoe-bench-bf16.safetensors size_gb=6 devices="cpu cuda" rule=even json="" keep=0
while [[ $# -gt 0 ]]; do
  case "$1" in
    --bin) bin=$2; shift 2 ;;
    --file) file=$2; shift 2 ;;
    --size-gb) size_gb=$2; shift 2 ;;
    --devices) devices=$2; shift 2 ;;
    --rule) rule=$2; shift 2 ;;
    --json) json=$2; shift 2 ;;
    --keep) keep=1; shift ;;
    *) echo "bench_convert.sh: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
[[ -x "$bin/mxmoe" ]] || { echo "bench_convert.sh: --bin: expected a folder with mxmoe, got '$bin'" >&2; exit 2; }
made=0
if [[ ! -f "$file" ]]; then
  [[ -x "$bin/make_checkpoint" ]] || { echo "bench_convert.sh: $bin/make_checkpoint is needed to write $file" >&2; exit 2; }
  "$bin/make_checkpoint" "$file" --size-gb "$size_gb" >&2
  made=1
fi
out="$file.mxfp4.safetensors"
trap 'rm -f "$out"; if [[ $made == 1 && $keep == 0 ]]; then rm -f "$file"; fi' EXIT

python3 - "$bin/mxmoe" "$file" "$out" "$rule" "$json" $devices <<'PY'
import json, os, platform, resource, subprocess, sys, time

mxmoe, src, dst, rule, json_out, *devices = sys.argv[1:]
size = os.path.getsize(src)

def timed(cmd, **kw):
    """(wall seconds, peak RSS in bytes, completed process) of one child."""
    t0 = time.perf_counter()
    p = subprocess.Popen(cmd, **kw)
    _, status, usage = os.wait4(p.pid, 0)
    p.returncode = os.waitstatus_to_exitcode(status)
    out = p.stdout.read() if p.stdout else b""
    return time.perf_counter() - t0, usage.ru_maxrss * 1024, p.returncode, out

def read_rate():
    with open(os.devnull, "wb") as null:
        subprocess.run(["cat", src], stdout=null, check=True)  # into the page cache
        wall, _, rc, _ = timed(["cat", src], stdout=null)
    return size / wall / 1e9

result = {"file": src, "file_bytes": size, "rule": rule, "host": platform.node(), "cpus": os.cpu_count(),
          "read_gb_s": round(read_rate(), 3), "runs": []}
print(f"read (cat, page cache): {result['read_gb_s']:.2f} GB/s for {size / 1e9:.2f} GB", file=sys.stderr)
for dev in devices:
    wall, rss, rc, out = timed([mxmoe, "quantize", src, dst, "--rule", rule, "--device", dev, "--force", "--json"],
                               stdout=subprocess.PIPE)
    run = {"device": dev, "exit_code": rc, "wall_s": round(wall, 3), "peak_rss_bytes": rss,
           "wall_gb_s": round(size / wall / 1e9, 3)}
    if rc == 0:
        rep = json.loads(out)
        run.update({k: rep[k] for k in ("seconds", "input_bytes", "output_bytes") if k in rep})
        if "input_gb_per_s" in rep:
            run["reported_gb_s"] = rep["input_gb_per_s"]
    run["vs_read"] = round(run["wall_gb_s"] / result["read_gb_s"], 3)
    result["runs"].append(run)
    print(f"quantize --device {dev}: exit {rc}, {wall:.2f} s, {run['wall_gb_s']:.2f} GB/s "
          f"({100 * run['vs_read']:.0f}% of read), peak RSS {rss / 2**30:.2f} GiB", file=sys.stderr)
text = json.dumps(result, indent=2)
print(text)
if json_out:
    with open(json_out, "w") as f:
        f.write(text + "\n")
PY
