// The NCCL communicator (include/mxmoe/parallel.h). NCCL is loaded at run time with dlopen —
// $MXMOE_NCCL_LIBRARY, else "libnccl.so.2" through the loader's search path — so the library and
// its static binaries carry no link-time NCCL dependency; nccl.h (the CUDA toolkit's) gives the
// types and signatures. Without nccl.h at build time NCCL is reported unavailable.
//
// all_to_all is one ncclGroupStart/End around a send and a receive per peer and part (point-to-
// point, self included); all_gather is ncclAllGather. Both are stream-ordered and capturable in a
// CUDA graph (NCCL >= 2.9).
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>
#include <thread>

#include "check.h"
#include "mxmoe/error.h"
#include "mxmoe/parallel.h"

#if __has_include(<nccl.h>)
#include <nccl.h>
#define MXMOE_HAVE_NCCL_H 1
#endif

namespace mxmoe::parallel {

#ifdef MXMOE_HAVE_NCCL_H
namespace {

static_assert(sizeof(ncclUniqueId) == sizeof(nccl_unique_id::bytes), "ncclUniqueId is 128 bytes");

// The NCCL functions mxmoe calls, resolved once.
struct nccl_api {
  std::string error;  // why NCCL is unavailable; empty when loaded
  decltype(&ncclGetVersion) get_version = nullptr;
  decltype(&ncclGetUniqueId) get_unique_id = nullptr;
  decltype(&ncclCommInitRank) comm_init_rank = nullptr;
  decltype(&ncclCommDestroy) comm_destroy = nullptr;
  decltype(&ncclGroupStart) group_start = nullptr;
  decltype(&ncclGroupEnd) group_end = nullptr;
  decltype(&ncclSend) send = nullptr;
  decltype(&ncclRecv) recv = nullptr;
  decltype(&ncclAllGather) all_gather = nullptr;
  decltype(&ncclGetErrorString) error_string = nullptr;
};

template <class F>
bool resolve(void* lib, const char* name, F* fn, std::string* error) {
  *fn = reinterpret_cast<F>(dlsym(lib, name));
  if (*fn == nullptr && error->empty()) *error = std::string("the NCCL library has no ") + name;
  return *fn != nullptr;
}

nccl_api load() {
  nccl_api a;
  setenv("NCCL_NVLS_ENABLE", "0", 0);  // before NCCL reads its environment: never NVLink multicast
  const char* env = std::getenv("MXMOE_NCCL_LIBRARY");
  const std::string path = env != nullptr && *env != '\0' ? env : "libnccl.so.2";
  void* lib = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) {
    const char* why = dlerror();
    a.error = "cannot load " + path + " (" + (why ? why : "dlopen failed") +
              "); set MXMOE_NCCL_LIBRARY to the path of libnccl.so.2";
    return a;
  }
  resolve(lib, "ncclGetVersion", &a.get_version, &a.error);
  resolve(lib, "ncclGetUniqueId", &a.get_unique_id, &a.error);
  resolve(lib, "ncclCommInitRank", &a.comm_init_rank, &a.error);
  resolve(lib, "ncclCommDestroy", &a.comm_destroy, &a.error);
  resolve(lib, "ncclGroupStart", &a.group_start, &a.error);
  resolve(lib, "ncclGroupEnd", &a.group_end, &a.error);
  resolve(lib, "ncclSend", &a.send, &a.error);
  resolve(lib, "ncclRecv", &a.recv, &a.error);
  resolve(lib, "ncclAllGather", &a.all_gather, &a.error);
  resolve(lib, "ncclGetErrorString", &a.error_string, &a.error);
  return a;  // the library stays loaded for the life of the process
}

const nccl_api& api() {
  static const nccl_api a = load();
  return a;
}

const nccl_api& loaded_api() {
  const nccl_api& a = api();
  if (!a.error.empty()) throw unsupported("NCCL is unavailable: " + a.error);
  return a;
}

void check(ncclResult_t r, const char* call) {
  if (r != ncclSuccess)
    throw std::runtime_error(std::string("NCCL error in ") + call + ": " + loaded_api().error_string(r));
}

class nccl_comm final : public communicator {
 public:
  nccl_comm(const nccl_unique_id& id, int rank, int ranks) : rank_(rank), ranks_(ranks) {
    const nccl_api& a = loaded_api();
    ncclUniqueId uid;
    std::memcpy(&uid, id.bytes.data(), sizeof uid);
    check(a.comm_init_rank(&comm_, ranks, uid, rank), "ncclCommInitRank");
    int v = 0;
    check(a.get_version(&v), "ncclGetVersion");
    version_ = std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) + "." + std::to_string(v % 100);
  }
  ~nccl_comm() override {
    if (comm_ != nullptr) api().comm_destroy(comm_);
  }
  int rank() const override { return rank_; }
  int size() const override { return ranks_; }
  device_kind device() const override { return device_kind::cuda; }
  std::string name() const override { return "nccl " + version_; }

  void all_to_all(const std::vector<exchange>& parts, void* stream) override {
    const nccl_api& a = loaded_api();
    const cudaStream_t s = static_cast<cudaStream_t>(stream);
    check(a.group_start(), "ncclGroupStart");
    for (const exchange& p : parts) {
      if (p.bytes == 0) continue;
      for (int q = 0; q < ranks_; ++q) {
        check(a.send(static_cast<const uint8_t*>(p.send) + static_cast<size_t>(q) * p.bytes, p.bytes, ncclUint8, q,
                     comm_, s),
              "ncclSend");
        check(a.recv(static_cast<uint8_t*>(p.recv) + static_cast<size_t>(q) * p.bytes, p.bytes, ncclUint8, q, comm_, s),
              "ncclRecv");
      }
    }
    check(a.group_end(), "ncclGroupEnd");
  }

  void all_gather(const void* send, void* recv, size_t bytes, void* stream) override {
    if (bytes == 0) return;
    check(loaded_api().all_gather(send, recv, bytes, ncclUint8, comm_, static_cast<cudaStream_t>(stream)),
          "ncclAllGather");
  }

 private:
  int rank_, ranks_;
  ncclComm_t comm_ = nullptr;
  std::string version_;
};

}  // namespace

bool nccl_available(std::string* why) {
  const nccl_api& a = api();
  if (why) *why = a.error;
  return a.error.empty();
}

nccl_unique_id nccl_new_unique_id() {
  ncclUniqueId uid;
  check(loaded_api().get_unique_id(&uid), "ncclGetUniqueId");
  nccl_unique_id id;
  std::memcpy(id.bytes.data(), &uid, sizeof uid);
  return id;
}

std::unique_ptr<communicator> nccl_communicator(const nccl_unique_id& id, int rank, int ranks) {
  MXMOE_CHECK_ARG(ranks >= 1, "ranks", ">= 1", std::to_string(ranks));
  MXMOE_CHECK_ARG(rank >= 0 && rank < ranks, "rank", "a value in [0, " + std::to_string(ranks) + ")", std::to_string(rank));
  loaded_api();
  return std::make_unique<nccl_comm>(id, rank, ranks);
}

#else  // no nccl.h at build time

bool nccl_available(std::string* why) {
  if (why) *why = "mxmoe was built without nccl.h (the CUDA toolkit's NCCL headers)";
  return false;
}
nccl_unique_id nccl_new_unique_id() { throw unsupported("NCCL is unavailable: mxmoe was built without nccl.h"); }
std::unique_ptr<communicator> nccl_communicator(const nccl_unique_id&, int, int) {
  throw unsupported("NCCL is unavailable: mxmoe was built without nccl.h");
}

#endif

namespace {

// Rank 0 writes `id` to `path` (a temporary in the same folder, then a rename: readers never see a
// partial file); the others wait for it.
nccl_unique_id share_id(const launch_info& info) {
  MXMOE_CHECK_ARG(!info.id_file.empty() || info.ranks == 1, "MXMOE_NCCL_ID_FILE",
                  "a path every rank can reach (scripts/launch.sh sets it)", "unset");
  if (info.rank == 0) {
    const nccl_unique_id id = nccl_new_unique_id();
    if (info.id_file.empty()) return id;
    const std::string tmp = info.id_file + ".tmp." + std::to_string(getpid());
    {
      std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
      f.write(id.bytes.data(), static_cast<std::streamsize>(id.bytes.size()));
      if (!f) throw std::runtime_error("cannot write the NCCL id to " + tmp);
    }
    std::filesystem::rename(tmp, info.id_file);
    return id;
  }
  const char* t = std::getenv("MXMOE_NCCL_TIMEOUT");
  const double timeout_s = t != nullptr && *t != '\0' ? std::atof(t) : 120.0;
  const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  nccl_unique_id id;
  while (true) {
    std::ifstream f(info.id_file, std::ios::binary);
    if (f && f.read(id.bytes.data(), static_cast<std::streamsize>(id.bytes.size()))) return id;
    if (std::chrono::steady_clock::now() > until)
      throw std::runtime_error("rank " + std::to_string(info.rank) + ": no NCCL id in " + info.id_file + " after " +
                               std::to_string(timeout_s) + " s (did rank 0 start?)");
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

}  // namespace

std::unique_ptr<communicator> nccl_from_environment() {
  const launch_info info = launch_info_from_environment();
  MXMOE_CHECK_ARG(info.launched, "WORLD_SIZE", "set by the launcher (scripts/launch.sh)", "unset");
  std::string why;
  if (!nccl_available(&why)) throw unsupported("NCCL is unavailable: " + why);
  int devices = 0;
  MXMOE_CUDA_CHECK(cudaGetDeviceCount(&devices));
  const int device = devices == 1 ? 0 : info.local_rank;
  MXMOE_CHECK_ARG(device < devices, "LOCAL_RANK", "below the visible GPU count " + std::to_string(devices),
                  std::to_string(info.local_rank));
  MXMOE_CUDA_CHECK(cudaSetDevice(device));
  return nccl_communicator(share_id(info), info.rank, info.ranks);
}

}  // namespace mxmoe::parallel
