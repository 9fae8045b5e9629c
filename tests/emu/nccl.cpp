// NCCL for the emulated device (tests/emu/device.h): not emulated. Every call fails with
// ncclInvalidUsage and says so, so that a data-parallel run on the emulated device stops with
// that message (the CPU's data-parallel path, Gloo, is what the test suite runs).
#include <nccl.h>

namespace {
constexpr const char* kWhy = "NCCL is not part of the emulated device (SKA_CUDA_EMULATION)";
}

extern "C" {
const char* ncclGetErrorString(ncclResult_t r) { return r == ncclSuccess ? "no error" : kWhy; }
const char* ncclGetLastError(ncclComm_t) { return kWhy; }
ncclResult_t ncclGetUniqueId(ncclUniqueId*) { return ncclInvalidUsage; }
ncclResult_t ncclCommInitRankConfig(ncclComm_t*, int, ncclUniqueId, int, ncclConfig_t*) {
  return ncclInvalidUsage;
}
ncclResult_t ncclCommFinalize(ncclComm_t) { return ncclInvalidUsage; }
ncclResult_t ncclCommDestroy(ncclComm_t) { return ncclInvalidUsage; }
ncclResult_t ncclCommAbort(ncclComm_t) { return ncclInvalidUsage; }
ncclResult_t ncclCommGetAsyncError(ncclComm_t, ncclResult_t* e) {
  *e = ncclInvalidUsage;
  return ncclInvalidUsage;
}
ncclResult_t ncclBroadcast(const void*, void*, size_t, ncclDataType_t, int, ncclComm_t,
                           cudaStream_t) {
  return ncclInvalidUsage;
}
ncclResult_t ncclAllReduce(const void*, void*, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t,
                           cudaStream_t) {
  return ncclInvalidUsage;
}
ncclResult_t ncclReduceScatter(const void*, void*, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t,
                               cudaStream_t) {
  return ncclInvalidUsage;
}
ncclResult_t ncclAllGather(const void*, void*, size_t, ncclDataType_t, ncclComm_t, cudaStream_t) {
  return ncclInvalidUsage;
}
}  // extern "C"
