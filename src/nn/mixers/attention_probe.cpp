// Attention probes: the thread's recorder that attention_weights() writes into, and the maps of
// one query over the key grid (plain, class-token and Swin's shifted-window layouts).
#include "nn/mixers/attention_probe.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <sstream>

#include "ops/ops.h"

namespace ska::nn {
namespace {

thread_local AttentionRecorder* t_recorder = nullptr;

int64_t square_side(int64_t n) {
  const auto side = static_cast<int64_t>(std::llround(std::sqrt(static_cast<double>(n))));
  return side * side == n ? side : -1;
}

// The grid cell holding relative position p in [0, 1) of a side of `size` cells.
int64_t cell_of(double p, int64_t size) {
  const auto cell = static_cast<int64_t>(std::floor(p * static_cast<double>(size)));
  return std::min<int64_t>(std::max<int64_t>(cell, 0), size - 1);
}

// The queries of plain weights [..., Nq, Nk]: one query over one key is a 1x1 grid (a last
// stage at 1x1), one over more keys class attention.
TokenLayout query_layout(const Tensor& weights) {
  if (weights.size(-2) == 1 && weights.size(-1) == 1) return {1, 1, false};
  return infer_token_layout(weights.size(-2), "queries");
}

// The row of `layout` that `query` names.
int64_t query_row(const TokenLayout& layout, const AttentionQuery& query) {
  if (query.cls) {
    SKA_CHECK(layout.cls, ValueError, "attention map: the layer's ", layout.tokens(),
              " queries have no class token; pick a position (--query i,j)");
    return 0;
  }
  SKA_CHECK(layout.height > 0, ValueError,
            "attention map: the layer's only query is the class token (class attention); "
            "use --query cls");
  const int64_t row = cell_of(query.y, layout.height), col = cell_of(query.x, layout.width);
  return (layout.cls ? 1 : 0) + row * layout.width + col;
}

// Plain layouts: weights [B, h, Nq, Nk].
AttentionMap plain_map(const Tensor& weights, const AttentionQuery& query, int64_t b) {
  SKA_CHECK(weights.dim() == 4, ShapeError, "attention map: expected weights [B, h, Nq, Nk], got ",
            weights.str());
  AttentionMap map;
  map.queries = query_layout(weights);
  map.keys =
      weights.size(3) == 1 ? TokenLayout{1, 1, false} : infer_token_layout(weights.size(3), "keys");
  map.query_row = query_row(map.queries, query);
  const Tensor row = weights.select(0, b).select(1, map.query_row);  // [h, Nk]
  const int64_t heads = row.size(0), first = map.keys.cls ? 1 : 0;
  map.grid = row.narrow(1, first, map.keys.height * map.keys.width)
                 .reshape({heads, map.keys.height, map.keys.width})
                 .contiguous();
  map.cls = first ? row.select(1, 0).contiguous() : Tensor::zeros({heads}, DType::kF32);
  return map;
}

// Swin: weights [B, h, windows, w*w, w*w] on a grid rolled by -shift; keys outside the query's
// window get 0.
AttentionMap window_map(const Tensor& weights, const AttentionWindows& win,
                        const AttentionQuery& query, int64_t b) {
  SKA_CHECK(!query.cls, ValueError,
            "attention map: windowed attention has no class token; "
            "pick a position (--query i,j)");
  const int64_t w = win.window, gh = win.grid_h, gw = win.grid_w, heads = weights.size(1);
  SKA_CHECK(weights.dim() == 5 && weights.size(2) == (gh / w) * (gw / w) &&
                weights.size(3) == w * w && weights.size(4) == w * w,
            ShapeError, "attention map: weights ", weights.str(), " are not ", w, "x", w,
            " windows of a ", gh, "x", gw, " grid");
  // The query's place on the rolled grid, its window and its row within the window.
  const int64_t r = (cell_of(query.y, gh) - win.shift + gh) % gh;
  const int64_t c = (cell_of(query.x, gw) - win.shift + gw) % gw;
  const int64_t window_index = (r / w) * (gw / w) + c / w;
  AttentionMap map;
  map.queries = map.keys = TokenLayout{gh, gw, false};
  map.query_row = (r % w) * w + c % w;
  const std::vector<float> row = weights.select(0, b)
                                     .select(1, window_index)
                                     .select(1, map.query_row)
                                     .to(DType::kF32)
                                     .contiguous()
                                     .to_vector<float>();  // [h, w*w]
  std::vector<float> grid(static_cast<size_t>(heads * gh * gw), 0.0f);
  for (int64_t h = 0; h < heads; ++h) {
    for (int64_t k = 0; k < w * w; ++k) {
      const int64_t kr = ((r / w) * w + k / w + win.shift) % gh;  // back to the unrolled grid
      const int64_t kc = ((c / w) * w + k % w + win.shift) % gw;
      grid[static_cast<size_t>((h * gh + kr) * gw + kc)] = row[static_cast<size_t>(h * w * w + k)];
    }
  }
  map.grid = Tensor::from_vector(grid, {heads, gh, gw});
  map.cls = Tensor::zeros({heads}, DType::kF32);
  return map;
}

}  // namespace

AttentionRecorder::AttentionRecorder() : previous_(t_recorder) { t_recorder = this; }

AttentionRecorder::~AttentionRecorder() { t_recorder = previous_; }

void AttentionRecorder::record(const Tensor& weights, const AttentionSpec& spec) {
  if (t_recorder) t_recorder->records_.push_back({weights.detach(), spec.windows});
}

bool AttentionRecorder::active() { return t_recorder != nullptr; }

TokenLayout infer_token_layout(int64_t tokens, const std::string& what) {
  if (tokens == 1) return {0, 0, true};
  const int64_t side = square_side(tokens);
  if (side > 0) return {side, side, false};
  const int64_t with_cls = square_side(tokens - 1);
  SKA_CHECK(with_cls > 0, ValueError, "attention map: ", tokens, " ", what,
            " form neither a square grid nor a class token and a square grid");
  return {with_cls, with_cls, true};
}

bool has_class_query(const AttentionRecord& record) {
  return record.windows.window == 0 && query_layout(record.weights).cls;
}

std::string AttentionQuery::str() const {
  if (cls) return "cls";
  std::ostringstream out;
  out << "(" << y << ", " << x << ")";
  return out.str();
}

AttentionMap attention_map(const AttentionRecord& record, const AttentionQuery& query,
                           int64_t batch_index) {
  SKA_CHECK(record.weights.defined() && batch_index >= 0 && batch_index < record.weights.size(0),
            ValueError, "attention map: batch index ", batch_index, " outside the recorded ",
            record.weights.defined() ? record.weights.size(0) : 0, " rows");
  const Tensor weights = record.weights.to(Device::cpu()).to(DType::kF32);
  AttentionMap map = record.windows.window > 0
                         ? window_map(weights, record.windows, query, batch_index)
                         : plain_map(weights, query, batch_index);
  return map;
}

}  // namespace ska::nn
