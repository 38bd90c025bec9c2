// moe_bench_parallel.cu — the MoE layer benchmark over P ranks (`bench_moe --ep P | --tp P`,
// `mxmoe bench --ep P | --tp P`): one process per GPU, launched as one NCCL group:
//
//   scripts/launch.sh -n 2 -- build/bin/bench_moe --ep 2 --shapes kimi-k2,gpt-oss-120b --tokens 8,64,512
//
// Per shape and T (the call's tokens, as in the one-GPU benchmark): EP: rank r holds the experts
// layout::even_split{E, P} gives it and T/P of the tokens (T < P is skipped); TP: rank r holds
// shard {r, P} of I and all T tokens. The weights are drawn on each GPU with the synthetic recipe
// (as moe_bench.cu), routing from random logits. Median of `iters` CUDA-graph replays, the L2
// flushed before each:
//   us        the parallel layer on rank 0 (routing, dispatch, experts, return, combine)
//   comm_us   the exchanges alone, the same sizes in the same groups (EP: the dispatch all-to-all of
//             x, ids and weights and the return all-to-all; TP: the all-gather of the partials)
//   gpu1_us   the one-GPU layer at the same T on rank 0's GPU
//   floor_us  rank 0's floor: the bytes of the experts it computes for (EP: its experts that any
//             rank's tokens touch; TP: its shard of every touched expert; E2M1 + scales) and of its
//             activations, at the copy bandwidth measured here (moe_bench.cu's ceiling)
// Only rank 0 prints and writes --json; every rank runs the same loop (the collectives keep them
// in step).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "check.h"
#include "moe_bench.h"
#include "mxmoe/cuda.h"
#include "mxmoe/forward.h"
#include "mxmoe/layout.h"
#include "mxmoe/parallel.h"
#include "mxmoe/presets.h"
#include "mxmoe/shard.h"
#include "mxmoe/synthetic.h"

namespace mxmoe::bench {
namespace {

// `cfg`'s shapes with the plainest routing (which a part's E need not satisfy: only its biases
// are drawn from it).
moe_config shapes_only(moe_config cfg) {
  cfg.routing = {};
  return cfg;
}

// What one GPU holds of the layer: its expert tensors on the device, its biases from the
// synthetic layer (the caller adds the correction bias [E]). Alive while this lives.
struct device_part {
  synthetic::mxfp4_layer host;  // biases
  device_expert_weights expert;
  moe_weights w;
  device_part(const moe_config& held, const moe_config& whole, bool biases, uint64_t seed)
      : host(synthetic::make_layer(shapes_only(held), {.biases = biases, .correction_bias = false, .expert_weights = false},
                                   seed)),
        expert(held.shape, whole.shape.intermediate, seed) {
    w = host.weights();
    expert.bind(w);
  }
};

// The median µs of `iters` replays of what `enqueue(stream)` captures, the L2 flushed before each.
template <class F>
double time_graph(F&& enqueue, int iters, cudaStream_t stream, cuda::device_buffer& flush) {
  enqueue(stream);  // eager first: NCCL connects its peers outside the capture
  MXMOE_CUDA_CHECK(cudaStreamSynchronize(stream));
  cudaGraph_t g;
  cudaGraphExec_t exec;
  MXMOE_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  enqueue(stream);
  MXMOE_CUDA_CHECK(cudaStreamEndCapture(stream, &g));
  MXMOE_CUDA_CHECK(cudaGraphInstantiate(&exec, g, 0));
  cudaGraphDestroy(g);
  cudaEvent_t e0, e1;
  MXMOE_CUDA_CHECK(cudaEventCreate(&e0));
  MXMOE_CUDA_CHECK(cudaEventCreate(&e1));
  for (int i = 0; i < 2; ++i) MXMOE_CUDA_CHECK(cudaGraphLaunch(exec, stream));
  std::vector<double> times;
  for (int it = 0; it < iters; ++it) {
    MXMOE_CUDA_CHECK(cudaMemsetAsync(flush.data(), it & 0xFF, flush.size(), stream));
    MXMOE_CUDA_CHECK(cudaEventRecord(e0, stream));
    MXMOE_CUDA_CHECK(cudaGraphLaunch(exec, stream));
    MXMOE_CUDA_CHECK(cudaEventRecord(e1, stream));
    MXMOE_CUDA_CHECK(cudaEventSynchronize(e1));
    float ms;
    MXMOE_CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
    times.push_back(ms * 1e3);
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  cudaGraphExecDestroy(exec);
  return median(times);
}

// Distinct experts of `ids` that `keep` accepts.
template <class Keep>
double touched(const std::vector<int32_t>& ids, Keep&& keep) {
  std::set<int32_t> s;
  for (int32_t e : ids)
    if (keep(e)) s.insert(e);
  return static_cast<double>(s.size());
}

std::vector<int32_t> route_on_host(const synthetic::layer_inputs& in, int64_t tokens, const moe_config& cfg,
                                   const std::vector<float>& correction) {
  const int64_t E = cfg.shape.experts, k = cfg.routing.top_k;
  std::vector<int32_t> ids(static_cast<size_t>(tokens * k));
  std::vector<float> w(ids.size());
  cpu::route(tensor_view(in.logits.data(), dtype::f32, {tokens, E}),
             correction.empty() ? tensor_view() : tensor_view(correction.data(), dtype::f32, {E}), cfg.routing,
             tensor_view(ids.data(), dtype::i32, {tokens, k}), tensor_view(w.data(), dtype::f32, {tokens, k}));
  return ids;
}

}  // namespace

int run_moe_bench_parallel(const moe_bench_options& opt) {
  const bool ep = opt.ep > 1;
  const int P = ep ? opt.ep : opt.tp;
  if ((opt.ep > 1) == (opt.tp > 1)) {
    std::fprintf(stderr, "bench: give one of --ep P and --tp P\n");
    return 2;
  }
  const parallel::launch_info launch = parallel::launch_info_from_environment();
  if (!launch.launched || launch.ranks != P) {
    std::fprintf(stderr,
                 "bench --%s %d: run one process per GPU as one NCCL group, e.g.\n"
                 "  scripts/launch.sh -n %d -- build/bin/bench_moe --%s %d ...\n(WORLD_SIZE is %s)\n",
                 ep ? "ep" : "tp", P, P, ep ? "ep" : "tp", P,
                 launch.launched ? std::to_string(launch.ranks).c_str() : "unset");
    return 2;
  }
  std::string why;
  if (!cuda::available(&why)) {
    std::fprintf(stderr, "bench: the cuda backend is unavailable: %s\n", why.c_str());
    return 3;
  }
  std::unique_ptr<parallel::communicator> comm = parallel::nccl_from_environment();
  const int rank = comm->rank();
  const bool lead = rank == 0;
  cudaDeviceProp prop{};
  int device = 0;
  MXMOE_CUDA_CHECK(cudaGetDevice(&device));
  MXMOE_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
  const double copy_tbps = measure_copy_tbps();
  if (lead) {
    std::printf("%s over %d ranks (%s), GPU %s, copy %.2f TB/s (read+write) on rank 0\n", ep ? "EP" : "TP", P,
                comm->name().c_str(), prop.name, copy_tbps);
    std::printf("%-14s %6s %9s %9s %7s %9s %8s %9s %6s %10s\n", "shape", "T", "us", "gpu1_us", "speedup", "comm_us",
                "comm_GB/s", "floor_us", "floor%", "tokens/s");
  }
  nlohmann::json table = nlohmann::json::array();
  const int64_t max_t = *std::max_element(opt.tokens.begin(), opt.tokens.end());
  cuda::device_buffer flush(size_t{256} << 20);
  cudaStream_t stream;
  MXMOE_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));

  for (const std::string& name : opt.shapes) {
    const model_preset* preset = find_model_preset(name);
    if (!preset) {
      std::fprintf(stderr, "bench: unknown shape '%s'\n", name.c_str());
      return 2;
    }
    const moe_config& cfg = preset->config;
    const int64_t E = cfg.shape.experts, H = cfg.shape.hidden, I = cfg.shape.intermediate;
    const int k = cfg.routing.top_k;
    const bool grouped = cfg.routing.kind == routing_kind::sigmoid_grouped_topk;
    const synthetic::mxfp4_layer whole_small =
        synthetic::make_layer(cfg, {.biases = false, .correction_bias = grouped, .expert_weights = false}, 5);
    const std::vector<int32_t> owners = contiguous_owners(E, P);
    const int64_t max_rows = ep ? std::max<int64_t>(1, max_t / P) : max_t;

    // This rank's part, prepared; its checkpoint-layout weights only while it is.
    std::optional<parallel::ep_layer> ep_layer;
    std::optional<parallel::tp_layer> tp_layer;
    moe_config held = cfg;
    if (ep) held.shape.experts = layout::even_split{E, P}.count(rank);
    else held.shape.intermediate = shard_intermediate(I, {rank, P});
    {
      device_part part(held, cfg, preset->has_biases, 100 + 4 * static_cast<uint64_t>(rank));
      part.w.correction_bias = whole_small.weights().correction_bias;
      if (!ep && rank != 0) part.w.down_bias = {};  // added once over the ranks
      if (ep) ep_layer.emplace(part.w, cfg, *comm, parallel::ep_options{.owners = owners, .max_tokens = max_rows});
      else tp_layer.emplace(part.w, cfg, *comm, parallel::tp_options{.max_tokens = max_rows, .sharded = true});
    }
    std::optional<prepared_moe> one_gpu;  // rank 0: the whole layer
    if (lead) {
      device_part whole(cfg, cfg, preset->has_biases, 11);  // the one-GPU benchmark's weights
      whole.w.correction_bias = whole_small.weights().correction_bias;
      one_gpu.emplace(prepare(whole.w, cfg, device_kind::cuda));
    }
    // Inputs: EP rank q's tokens from seed 300 + q (rank 0 draws them all, to count the experts its
    // rows touch); TP every rank the same call. The one-GPU layer gets the whole call's.
    std::vector<synthetic::layer_inputs> of_rank;
    for (int q = 0; q < (ep ? P : 1); ++q)
      of_rank.push_back(synthetic::make_inputs(cfg, whole_small.weights(), max_rows, 300 + static_cast<uint64_t>(q)));
    const synthetic::layer_inputs& mine = of_rank[ep ? static_cast<size_t>(rank) : 0];
    const synthetic::layer_inputs all = synthetic::make_inputs(cfg, whole_small.weights(), max_t, 300);
    cuda::device_buffer x(mine.x.size() * 2), logits(mine.logits.size() * 4), out(static_cast<size_t>(max_rows * H) * 2);
    x.upload(mine.x.data(), mine.x.size() * 2);
    logits.upload(mine.logits.data(), mine.logits.size() * 4);
    cuda::device_buffer x1(all.x.size() * 2), logits1(all.logits.size() * 4), out1(static_cast<size_t>(max_t * H) * 2);
    x1.upload(all.x.data(), all.x.size() * 2);
    logits1.upload(all.logits.data(), all.logits.size() * 4);
    cuda::device_buffer ws1(lead ? one_gpu->workspace_bytes(max_t) : 16);

    for (int64_t T : opt.tokens) {
      const int64_t rows = ep ? T / P : T;
      if (rows == 0) continue;  // fewer tokens than ranks (every rank skips it)
      routing_input ri;
      ri.logits = logits.view(dtype::f32, {rows, E});
      const tensor_view xv = x.view(dtype::bf16, {rows, H}), ov = out.view(dtype::bf16, {rows, H});
      const double us = time_graph(
          [&](cudaStream_t s) {
            if (ep) ep_layer->forward(xv, ri, ov, s);
            else tp_layer->forward(xv, ri, ov, s);
          },
          opt.iters, stream, flush);

      // The exchanges alone, the same sizes in the same groups.
      size_t comm_bytes = 0;
      double comm_us = 0;
      if (ep) {
        const size_t C = static_cast<size_t>(ep_layer->capacity(rows));
        const size_t xb = C * static_cast<size_t>(H) * 2, meta = C * static_cast<size_t>(k) * 4;
        cuda::device_buffer a(P * xb + 16), b(P * xb + 16), c(P * meta + 16), d(P * meta + 16), e(P * meta + 16),
            f(P * meta + 16);
        comm_us = time_graph(
            [&](cudaStream_t s) {
              comm->all_to_all({{a.data(), b.data(), xb}, {c.data(), d.data(), meta}, {e.data(), f.data(), meta}}, s);
              comm->all_to_all({{b.data(), a.data(), xb}}, s);
            },
            opt.iters, stream, flush);
        comm_bytes = static_cast<size_t>(P) * (ep_layer->dispatch_bytes(rows) + ep_layer->return_bytes(rows));
      } else {
        const size_t bytes = tp_layer->gather_bytes(rows);
        cuda::device_buffer a(bytes + 16), b(P * bytes + 16);
        comm_us = time_graph([&](cudaStream_t s) { comm->all_gather(a.data(), b.data(), bytes, s); }, opt.iters, stream,
                             flush);
        comm_bytes = static_cast<size_t>(P) * bytes;
      }

      if (!lead) continue;
      routing_input r1;
      r1.logits = logits1.view(dtype::f32, {T, E});
      const double gpu1_us = time_graph(
          [&](cudaStream_t s) {
            moe_forward(*one_gpu, x1.view(dtype::bf16, {T, H}), r1, out1.view(dtype::bf16, {T, H}), ws1.data(),
                        ws1.size(), s);
          },
          opt.iters, stream, flush);
      std::vector<int32_t> ids;  // the routing of every row rank 0 computes for
      for (const synthetic::layer_inputs& q : of_rank) {
        const std::vector<int32_t> part = route_on_host(q, rows, cfg, whole_small.correction_bias);
        ids.insert(ids.end(), part.begin(), part.end());
      }
      const double local = ep ? touched(ids, [&](int32_t e) { return owners[static_cast<size_t>(e)] == 0; })
                              : touched(ids, [](int32_t) { return true; });
      const double bytes = local * 3.0 * H * static_cast<double>(held.shape.intermediate) * 4.25 / 8.0 + 2.0 * rows * H * 2.0;
      const double floor_us = bytes / (copy_tbps * 1e12) * 1e6;
      std::printf("%-14s %6lld %9.1f %9.1f %6.2fx %9.1f %9.1f %9.1f %5.0f%% %10.0f\n", name.c_str(),
                  static_cast<long long>(T), us, gpu1_us, gpu1_us / us, comm_us, comm_bytes / comm_us * 1e-3, floor_us,
                  100.0 * floor_us / us, static_cast<double>(T) / us * 1e6);
      std::fflush(stdout);
      table.push_back({{"shape", name}, {"tokens", T}, {"mode", ep ? "ep" : "tp"}, {"ranks", P}, {"experts", E},
                      {"topk", k}, {"hidden", H}, {"intermediate", I}, {"rank0_tokens", rows},
                      {"rank0_touched_experts", local}, {"us", us}, {"gpu1_us", gpu1_us}, {"comm_us", comm_us},
                      {"comm_bytes", comm_bytes}, {"floor_us", floor_us}, {"tokens_per_s", T / us * 1e6}});
    }
  }
  cudaStreamDestroy(stream);
  if (lead && !opt.json_out.empty()) {
    char date[16];
    const std::time_t now = std::time(nullptr);
    std::strftime(date, sizeof date, "%Y-%m-%d", std::gmtime(&now));
    const nlohmann::json j = {{"gpu", prop.name}, {"commit", opt.commit}, {"date", date}, {"ranks", P},
                              {"mode", ep ? "ep" : "tp"}, {"communicator", comm->name()}, {"copy_tbps", copy_tbps},
                              {"rows", table}};
    std::ofstream(opt.json_out) << j.dump(2) << "\n";
  }
  return 0;
}

}  // namespace mxmoe::bench
