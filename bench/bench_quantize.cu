// bench_quantize — throughput of cuda::quantize_async (each scale rule, bf16 input, linear scales,
// with statistics and without (a null statistics pointer: the cheaper kernels), and rceil once with
// tiled scales) and cuda::dequantize (to bf16) for inputs of 64 MiB .. 2 GiB,
// as GB/s of bytes read plus written and as a fraction of the device copy bandwidth measured in
// the same run (cudaMemcpyAsync device to device, bytes read plus written).
//
// Timing: a spin kernel holds the stream while every timed run is enqueued between its own pair
// of CUDA events, so the events measure the GPU alone (no launch or host gaps); 3 warm-up runs;
// median of --iters runs (default 30). That per-call time is what the table's GB/s and fraction of
// copy use. Also reported ("b2b us"): --iters runs back to back between one pair of events, divided
// by --iters, as a pipeline of calls sees them (consecutive kernels may overlap their launch). Input: random bf16 (no zeros), regenerated per size; the
// smallest size (64 MiB plus outputs) exceeds no L2 cache by much, so no flush between runs.
//
// Usage: bench_quantize [--quick] [--sizes MIB,MIB,...] [--iters N] [--json PATH]
//   --quick: 64 MiB and 256 MiB only. --sizes: input sizes in MiB (each 1 .. 4096); the copy
//   bandwidth is always measured on 2 GiB (or the largest size if larger), where it has converged.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "check.h"
#include "mxmoe/cuda.h"
#include "mxmoe/layout.h"
#include "mxmoe/quantize.h"

namespace {

using mxmoe::dtype;
using mxmoe::scale_layout;
using mxmoe::mx::scale_rule;

constexpr int64_t kMiB = int64_t{1} << 20;
constexpr int64_t kK = 4096;  // row length of the benchmarked tensors

// Busy-waits on the GPU for `ns` nanoseconds so that the host can enqueue the timed runs behind it.
__global__ void hold_stream(uint64_t ns) {
  uint64_t start, now;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  do {
    __nanosleep(1000);
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  } while (now - start < ns);
}

// Random bf16 values: uniform magnitude in [0.5, 1) times 2^[-8, 7], random sign; never zero.
__global__ void fill_random_bf16(__nv_bfloat16* x, int64_t n, uint64_t seed) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    uint64_t h = (static_cast<uint64_t>(i) + seed) * 0x9E3779B97F4A7C15ull;
    h ^= h >> 31;
    h *= 0xBF58476D1CE4E5B9ull;
    h ^= h >> 29;
    const float mag = 0.5f + 0.5f * static_cast<float>(h & 0xFFFFFF) / 16777216.0f;
    const float v = ldexpf(mag, static_cast<int>((h >> 24) & 15) - 8);
    x[i] = __float2bfloat16((h >> 40) & 1 ? -v : v);
  }
}

// Median GPU time in microseconds of `iters` runs of `run`, each between its own events.
double time_us(const std::function<void()>& run, int iters) {
  for (int i = 0; i < 3; ++i) run();
  MXMOE_CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<cudaEvent_t> ev(2 * static_cast<size_t>(iters));
  for (auto& e : ev) MXMOE_CUDA_CHECK(cudaEventCreate(&e));
  hold_stream<<<1, 1>>>(uint64_t{50} * 1000 * 1000);  // 50 ms: far longer than enqueueing the runs
  MXMOE_CUDA_CHECK(cudaGetLastError());
  for (int i = 0; i < iters; ++i) {
    MXMOE_CUDA_CHECK(cudaEventRecord(ev[2 * static_cast<size_t>(i)]));
    run();
    MXMOE_CUDA_CHECK(cudaEventRecord(ev[2 * static_cast<size_t>(i) + 1]));
  }
  MXMOE_CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<double> us(static_cast<size_t>(iters));
  for (int i = 0; i < iters; ++i) {
    float ms = 0.0f;
    MXMOE_CUDA_CHECK(cudaEventElapsedTime(&ms, ev[2 * static_cast<size_t>(i)], ev[2 * static_cast<size_t>(i) + 1]));
    us[static_cast<size_t>(i)] = 1000.0 * ms;
  }
  for (auto& e : ev) MXMOE_CUDA_CHECK(cudaEventDestroy(e));
  std::nth_element(us.begin(), us.begin() + iters / 2, us.end());
  return us[static_cast<size_t>(iters / 2)];
}

// Mean GPU time in microseconds of `iters` runs of `run` enqueued back to back between two events.
double time_us_back_to_back(const std::function<void()>& run, int iters) {
  for (int i = 0; i < 3; ++i) run();
  MXMOE_CUDA_CHECK(cudaDeviceSynchronize());
  cudaEvent_t start, stop;
  MXMOE_CUDA_CHECK(cudaEventCreate(&start));
  MXMOE_CUDA_CHECK(cudaEventCreate(&stop));
  hold_stream<<<1, 1>>>(uint64_t{50} * 1000 * 1000);
  MXMOE_CUDA_CHECK(cudaGetLastError());
  MXMOE_CUDA_CHECK(cudaEventRecord(start));
  for (int i = 0; i < iters; ++i) run();
  MXMOE_CUDA_CHECK(cudaEventRecord(stop));
  MXMOE_CUDA_CHECK(cudaDeviceSynchronize());
  float ms = 0.0f;
  MXMOE_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
  MXMOE_CUDA_CHECK(cudaEventDestroy(start));
  MXMOE_CUDA_CHECK(cudaEventDestroy(stop));
  return 1000.0 * ms / iters;
}

struct row {
  std::string op, rule, layout, stats;  // stats: "yes", "no" (quantize) or "-"
  double mib, us, gbps, frac_copy, us_back_to_back;
};

std::string utc_now() {
  const std::time_t t = std::time(nullptr);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&t));
  return buf;
}

int attribute(cudaDeviceAttr a, int dev) {
  int v = 0;
  MXMOE_CUDA_CHECK(cudaDeviceGetAttribute(&v, a, dev));
  return v;
}

}  // namespace

int run(int argc, char** argv) {
  bool quick = false;
  int iters = 30;
  std::vector<int64_t> sizes_arg;
  std::string json_path;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--quick")) {
      quick = true;
    } else if (!std::strcmp(argv[i], "--iters") && i + 1 < argc) {
      iters = std::max(20, std::atoi(argv[++i]));
    } else if (!std::strcmp(argv[i], "--json") && i + 1 < argc) {
      json_path = argv[++i];
    } else if (!std::strcmp(argv[i], "--sizes") && i + 1 < argc) {
      for (const char* s = argv[++i]; *s;) {
        char* end = nullptr;
        const long long v = std::strtoll(s, &end, 10);
        if (end == s || v < 1 || v > 4096 || (*end != ',' && *end != '\0')) {
          std::fprintf(stderr, "--sizes: expected a comma-separated list of MiB in 1..4096, got '%s'\n", argv[i]);
          return 1;
        }
        sizes_arg.push_back(v);
        s = *end == ',' ? end + 1 : end;
      }
    } else {
      std::fprintf(stderr, "usage: %s [--quick] [--sizes MIB,...] [--iters N>=20] [--json PATH]\n", argv[0]);
      return 1;
    }
  }
  std::string why;
  if (!mxmoe::cuda::available(&why)) {
    std::printf("SKIPPED: bench_quantize needs an sm_90 GPU: %s\n", why.c_str());
    return 77;
  }
  int dev = 0;
  MXMOE_CUDA_CHECK(cudaGetDevice(&dev));
  const std::string gpu = mxmoe::cuda::device_name(dev);
  const int sm_khz = attribute(cudaDevAttrClockRate, dev), mem_khz = attribute(cudaDevAttrMemoryClockRate, dev);
  std::printf("GPU: %s, %d SMs, SM clock %d MHz (max), memory clock %d MHz, bus %d bits\n", gpu.c_str(),
              attribute(cudaDevAttrMultiProcessorCount, dev), sm_khz / 1000, mem_khz / 1000,
              attribute(cudaDevAttrGlobalMemoryBusWidth, dev));

  const std::vector<int64_t> sizes_mib = !sizes_arg.empty() ? sizes_arg
                                         : quick             ? std::vector<int64_t>{64, 256}
                                                             : std::vector<int64_t>{64, 256, 1024, 2048};
  const int64_t max_bytes = std::max<int64_t>(2048, *std::max_element(sizes_mib.begin(), sizes_mib.end())) * kMiB;
  mxmoe::cuda::device_buffer x(static_cast<size_t>(max_bytes)), copy_dst(static_cast<size_t>(max_bytes)),
      packed(static_cast<size_t>(max_bytes / 4)), scales(static_cast<size_t>(max_bytes / 32 + 65536)),
      stats(sizeof(mxmoe::quant_stats));

  // Copy bandwidth: the largest buffer, device to device.
  const auto copy = [&] {
    MXMOE_CUDA_CHECK(cudaMemcpyAsync(copy_dst.data(), x.data(), static_cast<size_t>(max_bytes), cudaMemcpyDeviceToDevice));
  };
  const double copy_us = time_us(copy, iters), copy_us_b2b = time_us_back_to_back(copy, iters);
  const double copy_gbps = 2.0 * static_cast<double>(max_bytes) / copy_us / 1000.0;
  std::printf("device copy: %lld MiB in %.1f us = %.0f GB/s (read + written); back to back %.1f us\n\n",
              static_cast<long long>(max_bytes / kMiB), copy_us, copy_gbps, copy_us_b2b);

  std::vector<row> rows;
  std::printf("%-10s %-6s %-12s %-5s %8s %10s %9s %7s %10s\n", "op", "rule", "scales", "stats", "MiB in", "us",
              "GB/s", "of copy", "b2b us");
  for (int64_t mib : sizes_mib) {
    const int64_t n = mib * kMiB / 2, r = n / kK;  // kK divides every size of at least 1 MiB
    fill_random_bf16<<<1024, 256>>>(static_cast<__nv_bfloat16*>(x.data()), n, static_cast<uint64_t>(mib));
    MXMOE_CUDA_CHECK(cudaGetLastError());
    const mxmoe::tensor_view xv = x.view(dtype::bf16, {r, kK}), pv = packed.view(dtype::u8, {r, kK / 2});
    // Times `run` both ways and prints a row.
    auto record = [&](const std::string& op, const std::string& rule, scale_layout l, const std::string& with_stats,
                      double bytes, const std::function<void()>& run) {
      const double us = time_us(run, iters), us_b2b = time_us_back_to_back(run, iters);
      const double gbps = bytes / us / 1000.0;
      rows.push_back({op, rule, mxmoe::to_string(l), with_stats, static_cast<double>(mib), us, gbps,
                      gbps / copy_gbps, us_b2b});
      std::printf("%-10s %-6s %-12s %-5s %8lld %10.1f %9.0f %6.1f%% %10.1f\n", op.c_str(), rule.c_str(),
                  mxmoe::to_string(l), with_stats.c_str(), static_cast<long long>(mib), us, gbps,
                  100.0 * gbps / copy_gbps, us_b2b);
    };
    const double quant_bytes = static_cast<double>(n) * (2.0 + 0.5 + 1.0 / 32.0);
    auto bench_quantize = [&](scale_rule rule, scale_layout l, bool with_stats) {
      const int64_t scale_elems = l == scale_layout::linear ? r * (kK / 32)
                                                            : mxmoe::layout::scale_tiled_128x4{r, kK / 32}.size();
      const mxmoe::tensor_view sv = l == scale_layout::linear ? scales.view(dtype::u8, {r, kK / 32})
                                                              : scales.view(dtype::u8, {scale_elems});
      auto* st = with_stats ? static_cast<mxmoe::quant_stats*>(stats.data()) : nullptr;
      record("quantize", mxmoe::mx::to_string(rule), l, with_stats ? "yes" : "no", quant_bytes,
             [&] { mxmoe::cuda::quantize_async(xv, rule, l, pv, sv, st); });
    };
    for (bool with_stats : {true, false})
      for (scale_rule rule : mxmoe::mx::kAllScaleRules) bench_quantize(rule, scale_layout::linear, with_stats);
    bench_quantize(scale_rule::rceil, scale_layout::tiled_128x4, true);
    record("dequantize", "-", scale_layout::linear, "-", quant_bytes, [&] {
      mxmoe::cuda::dequantize(pv, scales.view(dtype::u8, {r, kK / 32}), scale_layout::linear,
                              copy_dst.view(dtype::bf16, {r, kK}));
    });
  }

  // The targets of issue 3: floor/even/rceil >= 85% of copy from 256 MiB up; mse <= 1.5x rceil.
  for (const char* with_stats : {"yes", "no"}) {
    double worst_frac = 1e9, worst_mse_ratio = 0.0;
    for (const row& a : rows) {
      if (a.mib < 256 || a.op != "quantize" || a.stats != with_stats || a.layout != "linear") continue;
      if (a.rule != "mse") worst_frac = std::min(worst_frac, a.frac_copy);
      if (a.rule == "mse")
        for (const row& b : rows)
          if (b.mib == a.mib && b.rule == "rceil" && b.layout == "linear" && b.op == "quantize" && b.stats == a.stats)
            worst_mse_ratio = std::max(worst_mse_ratio, a.us / b.us);
    }
    std::printf("%ssummary (>= 256 MiB, statistics %s): slowest floor/even/rceil at %.1f%% of copy (target 85%%), "
                "mse/rceil time %.2fx (target 1.5x)\n",
                with_stats[0] == 'y' ? "\n" : "", with_stats, 100.0 * worst_frac, worst_mse_ratio);
  }

  if (!json_path.empty()) {
    nlohmann::json j;
    j["date"] = utc_now();
    j["gpu"] = gpu;
    j["sm_clock_mhz_max"] = sm_khz / 1000;
    j["mem_clock_mhz"] = mem_khz / 1000;
    j["copy_tbps"] = copy_gbps / 1000.0;
    j["copy_tbps_back_to_back"] = 2.0 * static_cast<double>(max_bytes) / copy_us_b2b / 1e6;
    j["iters"] = iters;
    j["k"] = kK;
    j["input"] = "bf16";
    for (const row& a : rows)
      j["rows"].push_back({{"op", a.op}, {"rule", a.rule}, {"layout", a.layout}, {"mib_in", a.mib}, {"us", a.us},
                           {"gbps", a.gbps}, {"frac_copy", a.frac_copy}, {"us_back_to_back", a.us_back_to_back},
                           {"stats", a.stats}});
    std::ofstream(json_path) << j.dump(2) << "\n";
    std::printf("wrote %s\n", json_path.c_str());
  }
  return 0;
}

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_quantize: %s\n", e.what());
    return 2;
  }
}
