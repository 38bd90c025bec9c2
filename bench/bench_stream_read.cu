// bench_stream_read — how fast the GPU can read the bytes of one decode step, when they are not in
// the L2: the practical ceiling of the MoE layer's GEMMs at T = 1 (issue: MoE decode at the memory
// roofline). At T = 1 the layer streams top_k experts' MXFP4 weights, a few MB to ~100 MB, in one
// short wave of CTAs; the floor it is measured against (bytes / the device copy rate measured on
// 1 GiB) leaves out the ramp (launch, the first DRAM round trips) and the tail (the last CTAs).
// This benchmark measures both with the simplest read that exists, so that a decode GEMM's time can
// be split into "what any read of these bytes costs" and "what the GEMM adds".
//
// Kernel: every thread reads 16-byte words (`ld.global.nc.L1::no_allocate`, 8 loads in flight per
// thread), XORs them, and stores only if the result equals a value it cannot take in practice (so
// the loads stay). Two orders: `stride` (the grid strides over the whole range: every CTA reads
// everywhere) and `chunk` (CTA b reads the b-th contiguous 1/grid of the range, as each decode CTA
// streams its own weight rows). Grids of 2, 3, 4 and 8 CTAs of 256 threads per SM.
// Time: `span`, from the first CTA's start to the last CTA's end (%globaltimer, one atomicMin and
// one atomicMax per CTA: close to what ncu's gpu__time_duration reports for a kernel run alone),
// and `event`, CUDA events around the launch (adds the launch itself). Median of --iters runs,
// the L2 emptied before each: `dirty` (a 256 MiB memset, as bench_moe's default flush: the read
// shares DRAM with the write-back of the memset's dirty lines) or `clean` (a 256 MiB read).
// Sizes: for every model preset, top_k experts' GEMM1 weights (2I x H), GEMM2 weights (H x I),
// and both, in the checkpoint's MXFP4 bytes (17/32 byte per weight: a code nibble plus a scale
// byte per 32); then 1 GiB, the asymptote.
//
// Napkin math (H100 SXM, copy 2.99 TB/s read + write): gpt-oss-120b's GEMM1 at T = 1 reads
// 4 x 2*2880*2880*17/32 = 35.3 MB: 11.8 us at the copy rate. A launch costs ~2-4 us of event time,
// the first bytes arrive ~1 us after a CTA issues its loads; if the stream then runs at the
// copy rate and the last wave ends evenly, the span is ~13 us. The decode GEMM1 takes ~20 us
// there (ncu), the whole layer ~39 us.
//
// Usage: bench_stream_read [--iters N] [--json PATH]
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "bench_main.h"
#include "check.h"
#include "moe_bench.h"
#include "mxmoe/presets.h"

namespace {

constexpr int kThreads = 256;
constexpr int kUnroll = 8;  // 16-byte loads in flight per thread: 32 KB per CTA

__device__ __forceinline__ uint64_t global_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)::"memory");
  return t;
}

__device__ __forceinline__ uint4 load_streaming(const uint4* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

// Reads words [begin, end) with `stride` between a thread's consecutive words, from `first`.
__device__ __forceinline__ uint32_t read_words(const uint4* p, int64_t first, int64_t end, int64_t stride) {
  uint32_t acc = 0;
  int64_t i = first;
  for (; i + (kUnroll - 1) * stride < end; i += kUnroll * stride) {
    uint4 v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) v[u] = load_streaming(p + i + u * stride);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
  }
  for (; i < end; i += stride) {
    const uint4 v = load_streaming(p + i);
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  return acc;
}

// span[0] = earliest CTA start (atomicMin), span[1] = latest CTA end (atomicMax), in ns.
__global__ void __launch_bounds__(kThreads) stream_read(const uint4* __restrict__ p, int64_t words, bool chunked,
                                                        uint32_t impossible, uint32_t* sink,
                                                        unsigned long long* span) {
  if (threadIdx.x == 0) atomicMin(&span[0], static_cast<unsigned long long>(global_ns()));
  uint32_t acc;
  if (chunked) {
    const int64_t chunk = (words + gridDim.x - 1) / gridDim.x;
    const int64_t begin = static_cast<int64_t>(blockIdx.x) * chunk;
    acc = read_words(p, begin + threadIdx.x, std::min(begin + chunk, words), blockDim.x);
  } else {
    acc = read_words(p, static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x, words,
                     static_cast<int64_t>(gridDim.x) * blockDim.x);
  }
  if (acc == impossible) sink[blockIdx.x * blockDim.x + threadIdx.x] = acc;
  __syncthreads();  // every thread's loads have returned (acc was used above)
  if (threadIdx.x == 0) atomicMax(&span[1], static_cast<unsigned long long>(global_ns()));
}

__global__ void fill_words(uint4* p, int64_t words) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < words;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    uint64_t z = (static_cast<uint64_t>(i) + 1) * 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    p[i] = make_uint4(static_cast<uint32_t>(z), static_cast<uint32_t>(z >> 32), static_cast<uint32_t>(~z),
                      static_cast<uint32_t>(i));
  }
}

struct size_point {
  std::string name;  // "<preset> gemm1|gemm2|both" or "1 GiB"
  int64_t bytes;
};

std::vector<size_point> size_points() {
  std::vector<size_point> v;
  for (const mxmoe::model_preset& p : mxmoe::model_presets()) {
    const mxmoe::moe_shape& s = p.config.shape;
    const int64_t k = p.config.routing.top_k;
    const int64_t gemm1 = k * 2 * s.intermediate * s.hidden * 17 / 32;
    const int64_t gemm2 = k * s.hidden * s.intermediate * 17 / 32;
    v.push_back({std::string(p.name) + " gemm1", gemm1});
    v.push_back({std::string(p.name) + " gemm2", gemm2});
    v.push_back({std::string(p.name) + " both", gemm1 + gemm2});
  }
  v.push_back({"1 GiB", int64_t{1} << 30});
  return v;
}

}  // namespace

int main(int argc, char** argv) {
  mxmoe::bench::iters_json_args args{15, ""};
  if (const int rc = mxmoe::bench::parse_iters_json(argc, argv, "bench_stream_read", args)) return rc;
  if (!mxmoe::bench::have_cuda_device("bench_stream_read")) return 3;
  const int iters = args.iters;
  cudaDeviceProp prop{};
  MXMOE_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  const int sms = prop.multiProcessorCount;
  const double copy_tbps = mxmoe::bench::measure_copy_tbps();

  const std::vector<size_point> sizes = size_points();
  int64_t max_bytes = 0;
  for (const size_point& s : sizes) max_bytes = std::max(max_bytes, s.bytes);
  const int64_t max_words = (max_bytes + 15) / 16;
  const int64_t flush_words = (int64_t{256} << 20) / 16;
  const int ctas_per_sm[] = {2, 3, 4, 8};
  const int max_grid = sms * 8;

  uint4 *data = nullptr, *flush = nullptr;
  uint32_t* sink = nullptr;
  unsigned long long* span = nullptr;
  MXMOE_CUDA_CHECK(cudaMalloc(&data, max_words * 16));
  MXMOE_CUDA_CHECK(cudaMalloc(&flush, flush_words * 16));
  MXMOE_CUDA_CHECK(cudaMalloc(&sink, sizeof(uint32_t) * max_grid * kThreads));
  MXMOE_CUDA_CHECK(cudaMalloc(&span, 2 * sizeof(unsigned long long)));
  fill_words<<<sms * 4, kThreads>>>(data, max_words);
  fill_words<<<sms * 4, kThreads>>>(flush, flush_words);
  MXMOE_CUDA_CHECK(cudaGetLastError());
  cudaEvent_t e0, e1;
  MXMOE_CUDA_CHECK(cudaEventCreate(&e0));
  MXMOE_CUDA_CHECK(cudaEventCreate(&e1));
  const unsigned long long span_init[2] = {std::numeric_limits<unsigned long long>::max(), 0};

  std::printf("%s, %d SMs; copy %.2f TB/s (read + write, 1 GiB). floor = bytes / copy rate; %% = floor / span\n",
              prop.name, sms, copy_tbps);
  std::printf("%-30s %9s %8s | %-22s %8s %6s %8s | %-22s %8s %6s\n", "bytes of", "MB", "floor us", "dirty: best grid",
              "span us", "%", "event us", "clean: best grid", "span us", "%");
  nlohmann::json rows = nlohmann::json::array();
  const char* flushes[] = {"dirty", "clean"};
  for (const size_point& s : sizes) {
    const int64_t words = s.bytes / 16;
    const double floor_us = static_cast<double>(s.bytes) / (copy_tbps * 1e12) * 1e6;
    std::string best_cfg[2];
    double best_span[2] = {1e30, 1e30}, best_event[2] = {0, 0};
    for (int f = 0; f < 2; ++f) {
      for (int chunked = 0; chunked < 2; ++chunked) {
        for (int per_sm : ctas_per_sm) {
          const int grid = sms * per_sm;
          std::vector<double> span_us, event_us;
          for (int it = 0; it < iters + 1; ++it) {
            if (f == 0)
              MXMOE_CUDA_CHECK(cudaMemsetAsync(flush, it & 0xFF, flush_words * 16));
            else
              stream_read<<<sms * 4, kThreads>>>(flush, flush_words, false, 0x9E3779B9u, sink, span);
            MXMOE_CUDA_CHECK(cudaMemcpyAsync(span, span_init, sizeof span_init, cudaMemcpyHostToDevice));
            MXMOE_CUDA_CHECK(cudaEventRecord(e0));
            stream_read<<<grid, kThreads>>>(data, words, chunked != 0, 0x9E3779B9u, sink, span);
            MXMOE_CUDA_CHECK(cudaEventRecord(e1));
            MXMOE_CUDA_CHECK(cudaGetLastError());
            MXMOE_CUDA_CHECK(cudaEventSynchronize(e1));
            unsigned long long ns[2];
            MXMOE_CUDA_CHECK(cudaMemcpy(ns, span, sizeof ns, cudaMemcpyDeviceToHost));
            float ms = 0;
            MXMOE_CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
            if (it >= 1) {
              span_us.push_back(static_cast<double>(ns[1] - ns[0]) * 1e-3);
              event_us.push_back(ms * 1e3);
            }
          }
          const double sp = mxmoe::bench::median(span_us), ev = mxmoe::bench::median(event_us);
          const std::string cfg = std::string(chunked ? "chunk" : "stride") + " x" + std::to_string(per_sm) + "/SM";
          rows.push_back({{"size", s.name}, {"bytes", s.bytes}, {"flush", flushes[f]}, {"order", chunked ? "chunk" : "stride"},
                          {"ctas_per_sm", per_sm}, {"span_us", sp}, {"event_us", ev}, {"floor_us", floor_us},
                          {"floor_fraction", floor_us / sp}, {"read_tbps", static_cast<double>(s.bytes) / (sp * 1e6)}});
          if (sp < best_span[f]) best_span[f] = sp, best_event[f] = ev, best_cfg[f] = cfg;
        }
      }
    }
    std::printf("%-30s %9.1f %8.1f | %-22s %8.1f %5.0f%% %8.1f | %-22s %8.1f %5.0f%%\n", s.name.c_str(), s.bytes / 1e6,
                floor_us, best_cfg[0].c_str(), best_span[0], 100.0 * floor_us / best_span[0], best_event[0],
                best_cfg[1].c_str(), best_span[1], 100.0 * floor_us / best_span[1]);
  }
  cudaFree(data);
  cudaFree(flush);
  cudaFree(sink);
  cudaFree(span);
  if (!args.json_path.empty()) {
    const nlohmann::json doc{{"device", prop.name}, {"sms", sms}, {"iters", iters}, {"copy_tbps", copy_tbps}, {"rows", rows}};
    if (!mxmoe::bench::write_json_file(args.json_path, doc, "bench_stream_read")) return 1;
  }
  return 0;
}
