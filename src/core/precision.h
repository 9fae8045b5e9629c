// Whether f32 matrix products and convolutions may use TF32 tensor cores on CUDA (10-bit
// mantissa inputs, f32 accumulation). The defaults are PyTorch's: off for matrix products
// (torch.backends.cuda.matmul.allow_tf32), on for cuDNN convolutions
// (torch.backends.cudnn.allow_tf32). bf16/f16 work is unaffected. Process-wide.
#pragma once

namespace ska {

struct Tf32Policy {
  bool matmul = false;
  bool conv = true;
};

Tf32Policy tf32_policy();
void set_tf32_policy(Tf32Policy policy);

// Restores the policy it found when it leaves scope.
class Tf32Guard {
 public:
  explicit Tf32Guard(Tf32Policy policy) : saved_(tf32_policy()) { set_tf32_policy(policy); }
  ~Tf32Guard() { set_tf32_policy(saved_); }
  Tf32Guard(const Tf32Guard&) = delete;
  Tf32Guard& operator=(const Tf32Guard&) = delete;

 private:
  Tf32Policy saved_;
};

// How cuDNN convolution algorithms are chosen on CUDA. Off (the default, PyTorch's
// torch.backends.cudnn.benchmark = False): by cuDNN's heuristics. On (what timm's training
// scripts set): the first call of each shape times every algorithm that fits the workspace cap
// and keeps the fastest, so later calls of that shape run it. Timings can pick different
// algorithms in different processes, and with them differently rounded results. Process-wide.
bool cudnn_benchmark();
void set_cudnn_benchmark(bool enabled);

// Whether cuDNN convolutions may only run algorithms cuDNN marks deterministic (PyTorch's
// torch.backends.cudnn.deterministic): some backward algorithms sum with atomics, so that runs
// round differently. On: the same bits on every run of a process and across processes (with
// cudnn_benchmark off, which otherwise times the choice); a CudaError names the convolution that
// has no deterministic algorithm. Off by default. Process-wide.
bool cudnn_deterministic();
void set_cudnn_deterministic(bool enabled);

}  // namespace ska
