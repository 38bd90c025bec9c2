// The GPU side of the parallel layers in a build without CUDA: each entry point says so.
#include "mxmoe/error.h"
#include "mxmoe/parallel.h"
#include "ops.h"

namespace mxmoe::parallel {
namespace {
[[noreturn]] void no_cuda() {
  throw unsupported("mxmoe was built without CUDA (no nvcc at configure time): no GPU parallel layers and no NCCL");
}
}  // namespace

namespace cuda_ops {
void ep_plan(const ep_call&, void*) { no_cuda(); }
void ep_pack(const ep_call&, void*) { no_cuda(); }
void ep_combine(const ep_call&, void*) { no_cuda(); }
void sum_partials(const partial_sum&, void*) { no_cuda(); }
void copy(void*, const void*, size_t, void*) { no_cuda(); }
void synchronize(void*) { no_cuda(); }
uint32_t read_flags(const uint32_t*) { no_cuda(); }
}  // namespace cuda_ops

bool nccl_available(std::string* why) {
  if (why) *why = "mxmoe was built without CUDA, so without NCCL";
  return false;
}
nccl_unique_id nccl_new_unique_id() { no_cuda(); }
std::unique_ptr<communicator> nccl_communicator(const nccl_unique_id&, int, int) { no_cuda(); }
std::unique_ptr<communicator> nccl_from_environment() { no_cuda(); }

}  // namespace mxmoe::parallel
