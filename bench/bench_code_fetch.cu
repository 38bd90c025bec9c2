// bench_code_fetch — what a kernel's first pass through its own code costs when that code is not
// in the caches: a question the MoE layer's decode path raises (docs/performance.md, "What limits
// it now"): at T = 1 its one-CTA plan kernel takes 8-11 us and its routing kernel 5-8 us, far more
// than their arithmetic, and their time grows with their code size (856 SASS instructions: 3.4 us;
// 4336-5656: 8-11 us) — as it would if each run fetched its instructions from DRAM. The benchmark
// forwards replay with the L2 flushed, and in a model the layer's weights (more than the L2) pass
// through it between two runs of the same kernel, so cold code is the realistic case.
//
// Kernel: one straight line of N dependent-free FMAs (4 accumulators, no loop: N SASS
// instructions, 16 bytes each), timed inside the kernel with %globaltimer (the first and last
// instruction tied to the FMAs by operands, so neither moves) and with CUDA events around the
// launch. Four cases, each the median of --iters runs:
//   warm:      the same kernel just ran (its code in the SM's instruction caches and in the L2);
//   l2:        a 256 KB straight-line kernel ran on every SM in between (more than an SM's
//              instruction caches hold: they now hold its code; the L2 still holds ours);
//   flush:     a 256 MiB memset ran in between (the L2 holds none of our code; the SMs'
//              instruction caches may, the memset's own code being small);
//   dram:      both: the 256 KB kernel, then the memset (fetched from DRAM).
// For one CTA and for one CTA per SM (all SMs missing on the same lines at once).
// Napkin math: at ~1 instruction per cycle and 1.7 GHz, 1024 instructions take ~0.6 us warm; a
// DRAM round trip is ~0.6-0.8 us, so a fetch that is not prefetched far ahead costs about one
// round trip per 128-byte line (8 instructions): up to ~80 us per 1024 instructions in the worst
// case, ~1 us if the fetch streams. Measured on an H100 (docs/performance.md, 2026-12-05, seventh
// session): ~0.6 ns per instruction within 16 KB, ~1.1 ns at 64 KB, 2.4 ns streaming from the L2,
// ~6 ns (230 ns per KB) from DRAM: the fetch streams, at about a DRAM round trip per 3 KB.
//
// Usage: bench_code_fetch [--iters N] [--json PATH]
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "bench_main.h"
#include "check.h"

namespace {

__device__ __forceinline__ uint64_t timer_after(float dep) {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t) : "f"(dep) : "memory");
  return t;
}

// TAG only makes a second copy of the same code at another address.
template <int N, int TAG>
__global__ void straight_line(float a, float b, float* out, unsigned long long* span_ns) {
  uint64_t t0;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0)::"memory");
  float x0 = static_cast<float>(threadIdx.x + (t0 & 1)), x1 = x0 + 1.0f, x2 = x0 + 2.0f, x3 = x0 + 3.0f;
#pragma unroll
  for (int i = 0; i < N / 4; ++i) {
    x0 = fmaf(x0, a, b);
    x1 = fmaf(x1, a, b);
    x2 = fmaf(x2, a, b);
    x3 = fmaf(x3, a, b);
  }
  const float s = (x0 + x1) + (x2 + x3);
  const uint64_t t1 = timer_after(s);
  out[blockIdx.x * blockDim.x + threadIdx.x] = s;
  if (threadIdx.x == 0) atomicMax(span_ns, static_cast<unsigned long long>(t1 - t0));
}

using kernel_fn = void (*)(float, float, float*, unsigned long long*);

struct straight_line_kernel {
  int instructions;
  kernel_fn fn;
};

const straight_line_kernel kSizes[] = {
    {256, straight_line<256, 0>},
    {1024, straight_line<1024, 0>},
    {4096, straight_line<4096, 0>},
    {16384, straight_line<16384, 0>},
};
constexpr kernel_fn kEvict = straight_line<16384, 1>;  // 256 KB of other code on every SM

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  mxmoe::bench::iters_json_args args{21, ""};
  if (const int rc = mxmoe::bench::parse_iters_json(argc, argv, "bench_code_fetch", args)) return rc;
  if (!mxmoe::bench::have_cuda_device("bench_code_fetch")) return 3;
  const int iters = args.iters;
  cudaDeviceProp prop{};
  MXMOE_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  const int sms = prop.multiProcessorCount, threads = 128;
  const size_t flush_bytes = size_t{256} << 20;
  void* flush = nullptr;
  float* out = nullptr;
  unsigned long long* span = nullptr;
  MXMOE_CUDA_CHECK(cudaMalloc(&flush, flush_bytes));
  MXMOE_CUDA_CHECK(cudaMalloc(&out, sizeof(float) * sms * threads));
  MXMOE_CUDA_CHECK(cudaMalloc(&span, sizeof(unsigned long long)));
  cudaEvent_t e0, e1;
  MXMOE_CUDA_CHECK(cudaEventCreate(&e0));
  MXMOE_CUDA_CHECK(cudaEventCreate(&e1));

  nlohmann::json rows = nlohmann::json::array();
  std::printf("%s, %d SMs. us: in-kernel span (event time)\n", prop.name, sms);
  const char* names[] = {"warm", "l2", "flush", "dram"};
  constexpr int kCases = 4;
  std::printf("%6s %6s %5s | %16s | %16s | %16s | %16s | %s\n", "instr", "KB", "CTAs", names[0], names[1], names[2],
              names[3], "dram - warm, ns per KB");
  for (const straight_line_kernel& s : kSizes) {
    for (int ctas : {1, sms}) {
      std::vector<double> span_us[kCases], event_us[kCases];
      for (int it = 0; it < iters + 2; ++it) {
        for (int c = 0; c < kCases; ++c) {
          if (c == 0 || c == 1) s.fn<<<ctas, threads>>>(1.0001f, 0.5f, out, span);  // ours in the L2
          if (c == 1 || c == 3) kEvict<<<sms, threads>>>(1.0001f, 0.5f, out, span);
          if (c == 2 || c == 3) MXMOE_CUDA_CHECK(cudaMemsetAsync(flush, it & 0xFF, flush_bytes));
          MXMOE_CUDA_CHECK(cudaMemsetAsync(span, 0, sizeof(unsigned long long)));
          MXMOE_CUDA_CHECK(cudaEventRecord(e0));
          s.fn<<<ctas, threads>>>(1.0001f, 0.5f, out, span);
          MXMOE_CUDA_CHECK(cudaEventRecord(e1));
          MXMOE_CUDA_CHECK(cudaGetLastError());
          MXMOE_CUDA_CHECK(cudaEventSynchronize(e1));
          unsigned long long ns = 0;
          MXMOE_CUDA_CHECK(cudaMemcpy(&ns, span, sizeof ns, cudaMemcpyDeviceToHost));
          float ms = 0;
          MXMOE_CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
          if (it >= 2) {
            span_us[c].push_back(ns * 1e-3);
            event_us[c].push_back(ms * 1e3);
          }
        }
      }
      const double kb = s.instructions * 16.0 / 1024.0;
      double sp[kCases], ev[kCases];
      for (int c = 0; c < kCases; ++c) sp[c] = median(span_us[c]), ev[c] = median(event_us[c]);
      std::printf("%6d %6.0f %5d | %7.2f (%6.2f) | %7.2f (%6.2f) | %7.2f (%6.2f) | %7.2f (%6.2f) | %.0f\n", s.instructions, kb, ctas,
                  sp[0], ev[0], sp[1], ev[1], sp[2], ev[2], sp[3], ev[3], (sp[3] - sp[0]) * 1e3 / kb);
      nlohmann::json row{{"instructions", s.instructions}, {"code_kb", kb}, {"ctas", ctas}};
      for (int c = 0; c < kCases; ++c) {
        row[std::string(names[c]) + "_span_us"] = sp[c];
        row[std::string(names[c]) + "_event_us"] = ev[c];
      }
      rows.push_back(row);
    }
  }
  if (!args.json_path.empty()) {
    const nlohmann::json doc{{"device", prop.name}, {"sms", sms}, {"iters", iters}, {"rows", rows}};
    if (!mxmoe::bench::write_json_file(args.json_path, doc, "bench_code_fetch")) return 1;
  }
  return 0;
}
