// Evaluation over a loader, and the sums that add up across workers (see evaluate.h).
#include "train/evaluate.h"

#include <cmath>
#include <cstdint>
#include <optional>
#include <vector>

#include "autograd/grad_mode.h"
#include "ops/loss.h"

namespace ska::train {

void count_hits(const float* row, int64_t classes, int64_t label, int64_t& top1, int64_t& top5) {
  const float target = row[label];
  if (std::isnan(target)) return;  // a NaN label logit ranks nowhere: a miss, not a tie
  int64_t above = 0;  // classes ranked before the label (ties go to the lower index, as topk)
  for (int64_t c = 0; c < classes; ++c) {
    if (std::isnan(row[c]) || row[c] > target || (row[c] == target && c < label)) ++above;
  }
  top1 += above < 1;
  top5 += above < 5;
}

EvalSums evaluate_sums(nn::Module& model, data::DataLoader& loader, Device device,
                       const EvalPrecision& precision) {
  const bool was_training = model.is_training();
  model.eval();
  NoGradGuard no_grad;
  AutocastGuard autocast_guard(precision.autocast.dtype, precision.autocast.enabled);
  std::optional<AutocastParamCasts> param_casts;  // the weights do not change during the pass
  if (precision.autocast.enabled && precision.cast_params_once) {
    param_casts.emplace(model.parameters(false));
  }
  EvalSums r;
  loader.start_epoch(0);
  data::Batch batch;
  while (loader.next(batch)) {
    const Tensor logits = model(batch.images.to(device));
    const Tensor labels = batch.labels.to(device);
    const int64_t n = batch.labels.numel();
    r.loss_sum += cross_entropy(logits, labels).item() * static_cast<double>(n);
    const Tensor host = logits.to(Device::cpu()).to(DType::kF32).contiguous();
    const int64_t classes = host.size(1);
    const int64_t* y = batch.labels.data<int64_t>();
    for (int64_t i = 0; i < n; ++i) count_hits(host.data<float>() + i * classes, classes, y[i], r.top1, r.top5);
    r.count += n;
  }
  model.train(was_training);
  return r;
}

EvalResult evaluate(nn::Module& model, data::DataLoader& loader, Device device,
                    const EvalPrecision& precision) {
  return evaluate_sums(model, loader, device, precision).result();
}

EvalResult EvalSums::result() const {
  EvalResult r;
  r.count = count;
  if (count > 0) {
    const double n = static_cast<double>(count);
    r.loss = loss_sum / n;
    r.top1 = 100.0 * static_cast<double>(top1) / n;
    r.top5 = 100.0 * static_cast<double>(top5) / n;
  }
  return r;
}

EvalSums EvalSums::all_reduced(dist::Communicator& comm) const {
  if (comm.backend() == "single") return *this;
  Tensor counts = Tensor::from_vector<int64_t>({top1, top5, count}, {3}).to(comm.device());
  Tensor loss = Tensor::from_vector<double>({loss_sum}, {1}).to(comm.device());
  comm.all_reduce(counts);
  comm.all_reduce(loss);
  const std::vector<int64_t> c = counts.to_vector<int64_t>();
  EvalSums s;
  s.top1 = c[0];
  s.top5 = c[1];
  s.count = c[2];
  s.loss_sum = loss.to_vector<double>()[0];
  return s;
}

}  // namespace ska::train
