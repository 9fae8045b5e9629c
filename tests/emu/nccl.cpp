// NCCL for the emulated device (tests/emu/device.h): the collectives the NCCL communicator makes
// (all-reduce, broadcast, all-gather, reduce-scatter; sum and average), between processes, each
// with its own emulated device (SKA_EMU_DEVICES devices, a worker on each), through POSIX shared
// memory. The unique id names a shared segment; every rank maps it, copies its part into its own
// slot, meets the others at a barrier, reads what it needs from every slot and meets them again
// before a slot is reused. Sums run in rank order (rank 0 first), in the type's arithmetic, 16-bit
// floats rounded after each addition: every rank gets the same bits. A collective runs on the
// device thread while the caller waits (streams are synchronous there); a peer that exited
// (kill(pid, 0)), an abort, or SKA_EMU_NCCL_TIMEOUT_S seconds (default 120) without the others
// fail it with ncclRemoteError and a message for ncclGetLastError. Not under CUDA Graph capture.
#include <fcntl.h>
#include <nccl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>

#include "tests/emu/device.h"
#include "tests/emu/values.h"

namespace {

constexpr int kMaxRanks = 64;
constexpr size_t kSlotBytes = size_t{8} << 20;  // a rank's part of one round
constexpr const char kIdPrefix[] = "ska-emu-nccl:";

// The head of the shared segment; the ranks' slots follow it.
struct Shared {
  std::atomic<int> arrived;          // at the current barrier
  std::atomic<uint32_t> generation;  // barriers passed
  std::atomic<int> aborted;          // 1 + the rank that aborted, or 0
  pid_t pids[kMaxRanks];
};
constexpr size_t kHeadBytes = (sizeof(Shared) + 4095) / 4096 * 4096;

double timeout_s() {
  const char* env = std::getenv("SKA_EMU_NCCL_TIMEOUT_S");
  const double t = env ? std::atof(env) : 0.0;
  return t > 0.0 ? t : 120.0;
}

}  // namespace

struct ncclComm {
  Shared* shared = nullptr;
  size_t bytes = 0;
  int nranks = 0, rank = 0;
  std::atomic<bool> aborted{false};
  std::string error;  // why the last call failed

  char* slot(int r) const { return reinterpret_cast<char*>(shared) + kHeadBytes + r * kSlotBytes; }

  // Every rank here, or false (error set) when one exited, one aborted or the time ran out.
  bool barrier() {
    const uint32_t gen = shared->generation.load();
    if (shared->arrived.fetch_add(1) + 1 == nranks) {
      shared->arrived.store(0);
      shared->generation.fetch_add(1);
      return true;
    }
    const auto deadline =
        std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s());
    for (int spins = 0; shared->generation.load() == gen; ++spins) {
      if (aborted.load() || shared->aborted.load() != 0) {
        const int who = shared->aborted.load() - 1;
        error = "the communicator was aborted" +
                (who >= 0 ? " by rank " + std::to_string(who) : std::string());
        return false;
      }
      if (spins % 256 == 255) {
        for (int r = 0; r < nranks; ++r) {
          if (r != rank && ::kill(shared->pids[r], 0) != 0 && errno == ESRCH) {
            error = "rank " + std::to_string(r) + " (pid " + std::to_string(shared->pids[r]) +
                    ") exited";
            return false;
          }
        }
        if (std::chrono::steady_clock::now() > deadline) {
          error = "the other ranks did not arrive within " + std::to_string(timeout_s()) + " s";
          return false;
        }
      }
      std::this_thread::sleep_for(std::chrono::microseconds(spins < 1000 ? 5 : 200));
    }
    return true;
  }
};

namespace {

size_t type_size(ncclDataType_t t) {
  switch (t) {
    case ncclInt8:
    case ncclUint8:
      return 1;
    case ncclFloat16:
    case ncclBfloat16:
      return 2;
    case ncclInt32:
    case ncclUint32:
    case ncclFloat32:
      return 4;
    default:
      return 8;
  }
}

// out[i] = the sum (or average) over ranks of slot(r)[offset + i], for n elements.
void reduce_slots(const ncclComm& c, size_t offset, size_t n, ncclDataType_t type, ncclRedOp_t op,
                  void* out) {
  const bool average = op == ncclAvg;
  for (size_t i = 0; i < n; ++i) {
    const size_t at = offset + i;
    switch (type) {
      case ncclFloat32: {
        float acc = reinterpret_cast<const float*>(c.slot(0))[at];
        for (int r = 1; r < c.nranks; ++r) acc += reinterpret_cast<const float*>(c.slot(r))[at];
        static_cast<float*>(out)[i] = average ? acc / static_cast<float>(c.nranks) : acc;
        break;
      }
      case ncclFloat64: {
        double acc = reinterpret_cast<const double*>(c.slot(0))[at];
        for (int r = 1; r < c.nranks; ++r) acc += reinterpret_cast<const double*>(c.slot(r))[at];
        static_cast<double*>(out)[i] = average ? acc / c.nranks : acc;
        break;
      }
      case ncclBfloat16:
      case ncclFloat16: {
        const auto e = type == ncclBfloat16 ? ska::emu::Element::kBF16 : ska::emu::Element::kF16;
        double acc = ska::emu::load(c.slot(0), e, static_cast<int64_t>(at));
        for (int r = 1; r < c.nranks; ++r) {
          ska::emu::store(out, e, static_cast<int64_t>(i),
                          static_cast<float>(acc) + static_cast<float>(ska::emu::load(
                                                        c.slot(r), e, static_cast<int64_t>(at))));
          acc = ska::emu::load(out, e, static_cast<int64_t>(i));
        }
        ska::emu::store(out, e, static_cast<int64_t>(i),
                        average ? static_cast<float>(acc) / static_cast<float>(c.nranks) : acc);
        break;
      }
      case ncclInt32: {
        int64_t acc = 0;
        for (int r = 0; r < c.nranks; ++r) acc += reinterpret_cast<const int32_t*>(c.slot(r))[at];
        static_cast<int32_t*>(out)[i] = static_cast<int32_t>(average ? acc / c.nranks : acc);
        break;
      }
      case ncclInt64: {
        int64_t acc = 0;
        for (int r = 0; r < c.nranks; ++r) acc += reinterpret_cast<const int64_t*>(c.slot(r))[at];
        static_cast<int64_t*>(out)[i] = average ? acc / c.nranks : acc;
        break;
      }
      default: {  // 8-bit
        int64_t acc = 0;
        for (int r = 0; r < c.nranks; ++r) acc += reinterpret_cast<const uint8_t*>(c.slot(r))[at];
        static_cast<uint8_t*>(out)[i] = static_cast<uint8_t>(average ? acc / c.nranks : acc);
        break;
      }
    }
  }
}

// Runs `body` (returning false on a failure, comm->error set) on `stream`'s device thread.
template <typename Body>
ncclResult_t run(ncclComm_t comm, cudaStream_t stream, const Body& body) {
  if (comm == nullptr) return ncclInvalidArgument;
  if (comm->aborted.load()) {
    comm->error = "the communicator was aborted";
    return ncclInvalidUsage;
  }
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(stream, &status) != cudaSuccess ||
      status != cudaStreamCaptureStatusNone) {
    comm->error = "the emulated NCCL takes no collective under CUDA Graph capture";
    return ncclInvalidUsage;
  }
  bool ok = false;
  if (ska::emu::submit(stream, [&] { ok = body(); }) != cudaSuccess) return ncclUnhandledCudaError;
  return ok ? ncclSuccess : ncclRemoteError;
}

}  // namespace

extern "C" {

const char* ncclGetErrorString(ncclResult_t r) {
  switch (r) {
    case ncclSuccess:
      return "no error";
    case ncclInvalidArgument:
      return "invalid argument";
    case ncclInvalidUsage:
      return "invalid usage";
    case ncclRemoteError:
      return "remote process exited or there was a network error";
    case ncclSystemError:
      return "unhandled system error";
    default:
      return "an error of the emulated NCCL";
  }
}
const char* ncclGetLastError(ncclComm_t comm) { return comm ? comm->error.c_str() : ""; }

ncclResult_t ncclGetUniqueId(ncclUniqueId* id) {
  static std::atomic<int> made{0};
  std::memset(id->internal, 0, sizeof id->internal);
  std::snprintf(id->internal, sizeof id->internal, "%s/ska_emu_nccl_%d_%d", kIdPrefix,
                static_cast<int>(::getpid()), made.fetch_add(1));
  return ncclSuccess;
}

ncclResult_t ncclCommInitRankConfig(ncclComm_t* out, int nranks, ncclUniqueId id, int rank,
                                    ncclConfig_t*) {
  *out = nullptr;
  if (nranks < 1 || nranks > kMaxRanks || rank < 0 || rank >= nranks ||
      std::strncmp(id.internal, kIdPrefix, sizeof kIdPrefix - 1) != 0) {
    return ncclInvalidArgument;
  }
  const std::string name(id.internal + sizeof kIdPrefix - 1);
  const int fd = ::shm_open(name.c_str(), O_CREAT | O_RDWR, 0600);
  if (fd < 0) return ncclSystemError;
  auto* comm = new ncclComm();
  comm->nranks = nranks;
  comm->rank = rank;
  comm->bytes = kHeadBytes + static_cast<size_t>(nranks) * kSlotBytes;
  void* p = MAP_FAILED;
  if (::ftruncate(fd, static_cast<off_t>(comm->bytes)) == 0) {
    p = ::mmap(nullptr, comm->bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  }
  ::close(fd);
  if (p == MAP_FAILED) {
    delete comm;
    return ncclSystemError;
  }
  comm->shared = static_cast<Shared*>(p);  // a new segment is zeros: its counters start at 0
  comm->shared->pids[rank] = ::getpid();
  if (!comm->barrier()) {
    std::fprintf(stderr, "emulated NCCL: rank %d could not join: %s\n", rank, comm->error.c_str());
    ::munmap(p, comm->bytes);
    delete comm;
    return ncclRemoteError;
  }
  if (rank == 0) ::shm_unlink(name.c_str());  // every rank has it mapped
  *out = comm;
  return ncclSuccess;
}

ncclResult_t ncclCommFinalize(ncclComm_t) { return ncclSuccess; }
ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  if (comm == nullptr) return ncclInvalidArgument;
  ::munmap(comm->shared, comm->bytes);
  delete comm;
  return ncclSuccess;
}
ncclResult_t ncclCommAbort(ncclComm_t comm) {
  if (comm == nullptr) return ncclInvalidArgument;
  // The others' collectives fail at once; the segment stays mapped (a caller may still ask for
  // the last error) until the process exits.
  comm->aborted.store(true);
  int none = 0;
  comm->shared->aborted.compare_exchange_strong(none, comm->rank + 1);
  return ncclSuccess;
}
ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* e) {
  if (comm == nullptr) return ncclInvalidArgument;
  *e = ncclSuccess;  // every call completes before it returns
  return ncclSuccess;
}

ncclResult_t ncclAllReduce(const void* send, void* recv, size_t count, ncclDataType_t type,
                           ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
  if (op != ncclSum && op != ncclAvg) return ncclInvalidArgument;
  return run(comm, stream, [&] {
    const size_t es = type_size(type), per_round = kSlotBytes / es;
    for (size_t done = 0; done < count; done += per_round) {
      const size_t n = std::min(per_round, count - done);
      std::memcpy(comm->slot(comm->rank), static_cast<const char*>(send) + done * es, n * es);
      if (!comm->barrier()) return false;
      reduce_slots(*comm, 0, n, type, op, static_cast<char*>(recv) + done * es);
      if (!comm->barrier()) return false;
    }
    return true;
  });
}

ncclResult_t ncclBroadcast(const void* send, void* recv, size_t count, ncclDataType_t type,
                           int root, ncclComm_t comm, cudaStream_t stream) {
  if (comm != nullptr && (root < 0 || root >= comm->nranks)) return ncclInvalidArgument;
  return run(comm, stream, [&] {
    const size_t es = type_size(type), bytes = count * es;
    for (size_t done = 0; done < bytes; done += kSlotBytes) {
      const size_t n = std::min(kSlotBytes, bytes - done);
      if (comm->rank == root) {
        std::memcpy(comm->slot(root), static_cast<const char*>(send) + done, n);
      }
      if (!comm->barrier()) return false;
      std::memcpy(static_cast<char*>(recv) + done, comm->slot(root), n);
      if (!comm->barrier()) return false;
    }
    return true;
  });
}

ncclResult_t ncclAllGather(const void* send, void* recv, size_t count, ncclDataType_t type,
                           ncclComm_t comm, cudaStream_t stream) {
  return run(comm, stream, [&] {
    const size_t bytes = count * type_size(type);
    for (size_t done = 0; done < bytes; done += kSlotBytes) {
      const size_t n = std::min(kSlotBytes, bytes - done);
      std::memcpy(comm->slot(comm->rank), static_cast<const char*>(send) + done, n);
      if (!comm->barrier()) return false;
      for (int r = 0; r < comm->nranks; ++r) {
        std::memcpy(static_cast<char*>(recv) + r * bytes + done, comm->slot(r), n);
      }
      if (!comm->barrier()) return false;
    }
    return true;
  });
}

ncclResult_t ncclReduceScatter(const void* send, void* recv, size_t count, ncclDataType_t type,
                               ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
  if (op != ncclSum && op != ncclAvg) return ncclInvalidArgument;
  return run(comm, stream, [&] {
    // A round carries n elements of every rank's part: rank d's at slot offset d * n.
    const size_t es = type_size(type), per_round = kSlotBytes / es / comm->nranks;
    for (size_t done = 0; done < count; done += per_round) {
      const size_t n = std::min(per_round, count - done);
      for (int d = 0; d < comm->nranks; ++d) {
        std::memcpy(comm->slot(comm->rank) + d * n * es,
                    static_cast<const char*>(send) + (d * count + done) * es, n * es);
      }
      if (!comm->barrier()) return false;
      reduce_slots(*comm, comm->rank * n, n, type, op, static_cast<char*>(recv) + done * es);
      if (!comm->barrier()) return false;
    }
    return true;
  });
}

}  // extern "C"
