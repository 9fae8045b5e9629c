// CopyStream without CUDA: there is no device to upload to.
#include "backend/copy_stream.h"
#include "core/error.h"

#ifndef SKA_WITH_CUDA
namespace ska {

struct CopyStream::Impl {};

CopyStream::CopyStream(Device device) : device_(device) {
  SKA_FAIL(DeviceError, "CopyStream for ", device,
           ": this build has no CUDA support (configure with -DSKA_CUDA=ON)");
}
CopyStream::~CopyStream() = default;
void CopyStream::upload(int, const std::vector<Tensor>&, const std::vector<Tensor>&) {}
void CopyStream::stream_wait(int) {}
void CopyStream::host_wait(int) {}

}  // namespace ska
#endif
