// Evaluation: top-1 / top-5 / loss of a model over a loader, as sums that add up across the
// workers of a data-parallel job (each evaluates its shard), then as percentages.
#pragma once

#include <cstdint>

#include "core/device.h"
#include "distributed/communicator.h"
#include "nn/module.h"
#include "ops/autocast.h"
#include "data/pipeline/loader.h"

namespace ska::train {

struct EvalResult {
  double loss = 0.0, top1 = 0.0, top5 = 0.0;  // accuracies in percent
  int64_t count = 0;
};

// What evaluation counts; sums of shards are the sums of the whole set.
struct EvalSums {
  double loss_sum = 0.0;  // cross-entropy summed over samples
  int64_t top1 = 0, top5 = 0, count = 0;
  EvalResult result() const;
  // The sums over every worker of `comm` (exact: counts travel as i64, the loss as f64).
  EvalSums all_reduced(dist::Communicator& comm) const;
};

// The precision evaluation runs in: under `autocast`; with `cast_params_once` (the trainer's
// `train.weight_casts: per_step`), the model's f32 parameters are cast to the autocast dtype once
// for the whole pass (AutocastParamCasts: one multi_cast call, the casts held until the pass
// ends) instead of by every op of every batch. The same values either way.
struct EvalPrecision {
  AutocastState autocast;
  bool cast_params_once = false;
};

// Adds one row of logits' top-1 and top-5 hits to the counts, ranking as torch.topk does: higher
// first, ties to the lower index, NaN above every number. A row whose label logit is NaN (a
// diverged model) is a miss, so that it can never score, nor become the best checkpoint.
void count_hits(const float* row, int64_t classes, int64_t label, int64_t& top1, int64_t& top5);

// Evaluates `model` (eval mode, no grad, in `precision`) on every batch of `loader`.
EvalSums evaluate_sums(nn::Module& model, data::DataLoader& loader, Device device,
                       const EvalPrecision& precision = EvalPrecision());
EvalResult evaluate(nn::Module& model, data::DataLoader& loader, Device device,
                    const EvalPrecision& precision = EvalPrecision());

}  // namespace ska::train
