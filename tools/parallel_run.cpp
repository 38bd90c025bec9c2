// `mxmoe run --ep P | --tp P` (parallel_run.h): the ranks' calls, the gathering of their outputs
// and the verification of the whole.
#include "parallel_run.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <vector>

#include "mxmoe/cuda.h"
#include "mxmoe/error.h"
#include "mxmoe/layout.h"
#include "mxmoe/parallel.h"
#include "mxmoe/shard.h"

namespace mxmoe::cli {
namespace {

// One rank's inputs (rows [first, first + rows) of the call) on the layer's device, and its output.
struct rank_io {
  tensor_view x, logits, out;
  std::vector<cuda::device_buffer> device;  // cuda: x, logits, out
  std::vector<float> host_out;              // cpu: f32 [rows, H]

  rank_io(const synthetic::layer_inputs& in, int64_t first, int64_t rows, device_kind d) {
    const int64_t H = in.hidden, E = in.experts;
    const uint16_t* x16 = in.x.data() + first * H;
    const float* lg = in.logits.data() + first * E;
    if (d == device_kind::cpu) {
      x = tensor_view(x16, dtype::bf16, {rows, H});
      logits = tensor_view(lg, dtype::f32, {rows, E});
      host_out.resize(static_cast<size_t>(rows * H));
      out = tensor_view(host_out.data(), dtype::f32, {rows, H});
      return;
    }
    device.emplace_back(static_cast<size_t>(rows * H) * 2 + 16);
    device.back().upload(x16, static_cast<size_t>(rows * H) * 2);
    x = device.back().view(dtype::bf16, {rows, H});
    device.emplace_back(static_cast<size_t>(rows * E) * 4 + 16);
    device.back().upload(lg, static_cast<size_t>(rows * E) * 4);
    logits = device.back().view(dtype::f32, {rows, E});
    device.emplace_back(static_cast<size_t>(rows * H) * 2 + 16);
    out = device.back().view(dtype::bf16, {rows, H});
  }
  routing_input routing() const {
    routing_input r;
    r.logits = logits;
    return r;
  }
  // The output as f32, into dst [rows, H] (synchronizes for cuda).
  void read(float* dst) const {
    const size_t n = static_cast<size_t>(out.numel());
    if (out.device == device_kind::cpu) {
      std::memcpy(dst, host_out.data(), n * 4);
      return;
    }
    cuda::synchronize();
    std::vector<uint16_t> v(n);
    device.back().download(v.data(), n * 2);
    for (size_t i = 0; i < n; ++i) dst[i] = bf16_to_float(v[i]);
  }
};

}  // namespace

parallel_outcome run_verified_parallel(const moe_weights& weights, const moe_config& cfg,
                                       const synthetic::layer_inputs& in, device_kind backend,
                                       std::optional<cpu::precision> reference, const parallel_request& request) {
  const bool ep = request.ep > 1;
  MXMOE_CHECK_ARG((request.ep > 1) != (request.tp > 1) && request.ep >= 1 && request.tp >= 1, "--ep/--tp",
                  "one of them > 1", "--ep " + std::to_string(request.ep) + " --tp " + std::to_string(request.tp));
  const int P = ep ? request.ep : request.tp;
  const int64_t T = in.tokens, H = cfg.shape.hidden;
  if (ep)
    MXMOE_CHECK_ARG(T % P == 0, "--tokens", "a multiple of --ep " + std::to_string(P) + " (each rank gets T/P tokens)",
                    std::to_string(T));
  const parallel::launch_info launch = parallel::launch_info_from_environment();
  if (launch.launched) {
    MXMOE_CHECK_ARG(launch.ranks == P, ep ? "--ep" : "--tp", "WORLD_SIZE = " + std::to_string(launch.ranks) +
                    " (the processes launched)", std::to_string(P));
    MXMOE_CHECK_ARG(backend == device_kind::cuda, "--device", "cuda (NCCL runs between GPUs)", "cpu");
  }
  const int64_t rows = ep ? T / P : T;
  const std::vector<int32_t> owners = ep ? contiguous_owners(cfg.shape.experts, P) : std::vector<int32_t>{};

  parallel_outcome res;
  res.run.out.assign(static_cast<size_t>(T * H), 0.0f);
  std::vector<std::vector<float>> tp_out(static_cast<size_t>(P));  // TP: every rank's, to compare
  std::mutex timing;
  // Rank r: prepare its part, run its call once, leave its output in io.
  const auto run_rank = [&](int r, parallel::communicator& comm, rank_io& io) {
    const auto t0 = std::chrono::steady_clock::now();
    if (ep) {
      const owned_weights mine = select_experts(weights, cfg, expert_map_of(owners, r));
      parallel::ep_layer layer(mine.weights(), cfg, comm, {.owners = owners, .max_tokens = rows, .capacity = 0});
      layer.forward(io.x, io.routing(), io.out);
    } else {
      parallel::tp_layer layer(weights, cfg, comm, {.max_tokens = rows});
      layer.forward(io.x, io.routing(), io.out);
    }
    if (backend == device_kind::cuda) cuda::synchronize();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::lock_guard<std::mutex> lock(timing);
    res.run.backend_seconds = std::max(res.run.backend_seconds, s);
  };
  const std::string mode = std::string(ep ? "EP" : "TP") + " over " + std::to_string(P) + " ranks";
  const std::string split = ep ? ", " + std::to_string(rows) + " tokens and " +
                                     std::to_string(layout::even_split{cfg.shape.experts, P}.count(0)) +
                                     " experts on rank 0"
                               : ", I " + std::to_string(shard_intermediate(cfg.shape.intermediate, {0, P})) +
                                     " on rank 0";

  if (!launch.launched) {
    auto group = parallel::make_local_group(P, backend);
    parallel::run_ranks(P, [&](int r) {
      rank_io io(in, ep ? r * rows : 0, rows, backend);
      run_rank(r, *group[static_cast<size_t>(r)], io);
      if (ep) {
        io.read(res.run.out.data() + static_cast<size_t>(r * rows * H));
      } else {
        tp_out[static_cast<size_t>(r)].resize(static_cast<size_t>(T * H));
        io.read(tp_out[static_cast<size_t>(r)].data());
      }
    });
    res.description = mode + " (" + group[0]->name() + ")" + split;
    if (!ep) {
      for (int r = 1; r < P; ++r)
        if (tp_out[static_cast<size_t>(r)] != tp_out[0])
          throw std::runtime_error("tensor parallelism: rank " + std::to_string(r) + " ended with other bits than rank 0");
      res.run.out = tp_out[0];
    }
  } else {
    auto comm = parallel::nccl_from_environment();
    rank_io io(in, ep ? launch.rank * rows : 0, rows, backend);
    run_rank(launch.rank, *comm, io);
    if (ep) {  // every rank gathers the whole output
      cuda::device_buffer all(static_cast<size_t>(T * H) * 2 + 16);
      comm->all_gather(io.out.data, all.data(), static_cast<size_t>(rows * H) * 2, nullptr);
      cuda::synchronize();
      std::vector<uint16_t> v(static_cast<size_t>(T * H));
      all.download(v.data(), v.size() * 2);
      for (size_t i = 0; i < v.size(); ++i) res.run.out[i] = bf16_to_float(v[i]);
    } else {
      io.read(res.run.out.data());
    }
    res.description = mode + " (" + comm->name() + ", this is rank " + std::to_string(launch.rank) + ")" + split;
    res.primary = launch.rank == 0;
  }
  const tensor_view out(res.run.out.data(), dtype::f32, {T, H});
  if (reference) res.run.check = verify_forward(weights, cfg, in.x_view(), in.routing(), out, backend, *reference);
  return res;
}

}  // namespace mxmoe::cli
