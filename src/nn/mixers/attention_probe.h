// Attention probes (the paper's Figure 5): while an AttentionRecorder is alive on a thread, the
// attention core hands it every weight tensor it computes there, unchanged; attention_map() cuts
// one query's weights over the key grid out of such a record.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "nn/mixers/attention_core.h"

namespace ska::nn {

// One attention_weights() call: the weights [..., h, Nq, Nk] (Swin: [B, h, windows, w*w, w*w])
// as the core applied them to v (after talking heads; detached, not copied) and where the
// windows lie.
struct AttentionRecord {
  Tensor weights;
  AttentionWindows windows;
};

// Records the attention weights computed on this thread while alive (nested recorders: the
// innermost records, the outer one resumes when it ends). Recording keeps the tensors alive and
// changes no number.
class AttentionRecorder {
 public:
  AttentionRecorder();
  ~AttentionRecorder();
  AttentionRecorder(const AttentionRecorder&) = delete;
  AttentionRecorder& operator=(const AttentionRecorder&) = delete;

  const std::vector<AttentionRecord>& records() const { return records_; }

  // Called by attention_weights(): appends to this thread's recorder, if any.
  static void record(const Tensor& weights, const AttentionSpec& spec);
  // Whether a recorder is alive on this thread (attention then takes the unfused path, whose
  // weights it can record).
  static bool active();

 private:
  AttentionRecorder* previous_;
  std::vector<AttentionRecord> records_;
};

// Where a layer's tokens lie: an optional class token first, then a height x width grid in
// row-major order (height 0: the class token alone, as class attention's single query).
struct TokenLayout {
  int64_t height = 0, width = 0;
  bool cls = false;
  int64_t tokens() const { return height * width + (cls ? 1 : 0); }
};
// The layout of `tokens` tokens: a square grid (s*s), a class token and a square grid (s*s + 1)
// or the class token alone (1). ValueError naming `what` otherwise.
TokenLayout infer_token_layout(int64_t tokens, const std::string& what);

// True when the record's first query is a class token (ViT, CaiT class attention, CvT's last
// stage); false for windows and plain grids.
bool has_class_query(const AttentionRecord& record);

// The query whose attention is drawn: the class token, or the token at relative image position
// (y, x) in [0, 1) (row, column), whatever the layer's grid.
struct AttentionQuery {
  bool cls = false;
  double y = 0.5, x = 0.5;
  std::string str() const;  // "cls" or "(y, x)"
};

// One query's attention in a record: `grid` [h, kh, kw] f32 on the CPU, the weights on the keys
// of the spatial grid (Swin: the whole token grid, 0 outside the query's window), and `cls` [h],
// the weight on the class key (0 without one).
struct AttentionMap {
  Tensor grid;
  Tensor cls;
  TokenLayout queries, keys;
  int64_t query_row = 0;  // the row of the weights drawn (within the window for Swin)
};
// ValueError when the query is the class token and the layer has no class query, or when the
// token counts form no grid.
AttentionMap attention_map(const AttentionRecord& record, const AttentionQuery& query,
                           int64_t batch_index = 0);

}  // namespace ska::nn
