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

}  // namespace ska
