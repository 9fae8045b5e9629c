// Records a forward pass module by module: the per-layer table of `summary` (name, type, output
// shape, parameters, MACs). Active while it lives; Module::operator() reports to it.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/tensor.h"
#include "ops/mac_counter.h"

namespace ska::nn {

class Module;

class SummaryRecorder {
 public:
  struct Row {
    std::string name;  // dotted path; "" for the root
    std::string type;
    int depth = 0;
    Shape output;
    int64_t params = 0;  // trainable parameters owned by this module and its children
    int64_t macs = 0;    // multiply-accumulates during this call, children included
  };

  explicit SummaryRecorder(Module& root);
  ~SummaryRecorder();
  SummaryRecorder(const SummaryRecorder&) = delete;
  SummaryRecorder& operator=(const SummaryRecorder&) = delete;

  static SummaryRecorder* active();
  size_t begin(Module* module);
  void end(size_t slot, const Tensor& output);
  const std::vector<Row>& rows() const { return rows_; }

 private:
  std::unordered_map<const Module*, std::string> names_;
  std::vector<Row> rows_;
  std::vector<std::unique_ptr<MacCounter>> open_;  // one per call in progress
  int depth_ = 0;
  SummaryRecorder* previous_;
};

// Runs `call` (which returns the module's output), recording it as a call of `module` when a
// SummaryRecorder is active: what Module::operator() does around forward, for a module's other
// entry points (CaiT's class layers, which take the class token and the patches apart).
template <typename F>
Tensor record_call(Module* module, F&& call) {
  SummaryRecorder* rec = SummaryRecorder::active();
  if (!rec) return call();
  const size_t slot = rec->begin(module);
  Tensor y = call();
  rec->end(slot, y);
  return y;
}

}  // namespace ska::nn
