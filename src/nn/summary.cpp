// SummaryRecorder: one row per module call, with nested MAC counters.
#include "nn/summary.h"

#include "nn/module.h"

namespace ska::nn {

namespace {
thread_local SummaryRecorder* current = nullptr;
}  // namespace

SummaryRecorder::SummaryRecorder(Module& root) : previous_(current) {
  for (const auto& [name, module] : root.named_modules()) names_[module] = name;
  current = this;
}

SummaryRecorder::~SummaryRecorder() { current = previous_; }

SummaryRecorder* SummaryRecorder::active() { return current; }

size_t SummaryRecorder::begin(Module* module) {
  Row row;
  auto it = names_.find(module);
  row.name = it != names_.end() ? it->second : "?";
  row.type = module->type_name();
  row.depth = depth_++;
  row.params = module->num_parameters(true);
  rows_.push_back(row);
  open_.push_back(std::make_unique<MacCounter>());
  return rows_.size() - 1;
}

void SummaryRecorder::end(size_t slot, const Tensor& output) {
  rows_[slot].macs = open_.back()->total();
  rows_[slot].output = output.defined() ? output.shape() : Shape{};
  open_.pop_back();
  --depth_;
}

}  // namespace ska::nn
