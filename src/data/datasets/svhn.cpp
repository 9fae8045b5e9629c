// The SVHN reader (see svhn.h): X and y found by name in the MAT file, checked against each other,
// X transposed from MATLAB's column-major [H, W, C, N] to channels-last [N, H, W, C].
#include "data/datasets/svhn.h"

#include <cmath>
#include <cstdint>
#include <cstring>

#include "core/error.h"
#include "data/datasets/file_bytes.h"
#include "data/datasets/mat_file.h"

namespace ska::data {
namespace {

constexpr int64_t kChannels = 3;
constexpr const char* kExpected = "X (uint8 [32, 32, 3, N]) and y ([N, 1], 1..10)";

// The variable `name`, numeric and real.
const MatArray& numeric_variable(const std::vector<MatArray>& arrays, const std::string& name,
                                 const std::string& path) {
  const MatArray* a = find_mat_array(arrays, name);
  SKA_CHECK(a != nullptr, IOError, "svhn: '", path, "' has no variable '", name, "'; expected ",
            kExpected);
  SKA_CHECK(a->has_data && !a->is_complex, IOError, "svhn: '", path, "' variable '", name,
            "' is a ", a->is_complex ? "complex " : "", mat_class_name(a->mx_class),
            " array; expected a real numeric array");
  return *a;
}

// X's dims [H, W, C, N] with C == 3.
void check_images(const MatArray& x, const std::string& path) {
  const auto& d = x.dims;
  SKA_CHECK(d.size() == 4 && d[2] == kChannels && d[0] > 0 && d[1] > 0, IOError, "svhn: '", path,
            "' variable 'X' has ", d.size(), " dims ", shape_str(d),
            "; expected [H, W, 3, N] (SVHN: [32, 32, 3, N])");
}

// y's dims [N, 1] (or [1, N]) with X's N.
void check_labels(const MatArray& y, int64_t n, const std::string& path) {
  const auto& d = y.dims;
  const bool column = d.size() == 2 && ((d[0] == n && d[1] == 1) || (d[0] == 1 && d[1] == n));
  SKA_CHECK(column, IOError, "svhn: '", path, "' variable 'y' has dims ", shape_str(d),
            "; expected [", n, ", 1] (one label per image of X)");
}

// X (column-major [H, W, C, N]) as a [N, H, W, C] tensor.
Tensor transpose_images(const MatArray& x, const std::string& path) {
  const int64_t h = x.dims[0], w = x.dims[1], n = x.dims[3];
  std::vector<uint8_t> values(static_cast<size_t>(x.numel));
  if (x.data_type == kMiUInt8) {
    std::memcpy(values.data(), x.data(), values.size());
  } else {
    for (int64_t i = 0; i < x.numel; ++i) {
      const double v = x.value(i);
      SKA_CHECK(v >= 0 && v <= 255 && v == std::floor(v), IOError, "svhn: '", path,
                "' variable 'X' element ", i, " is ", v, "; expected a pixel value 0..255");
      values[i] = static_cast<uint8_t>(v);
    }
  }
  Tensor out = Tensor::empty({n, h, w, kChannels}, DType::kU8);
  uint8_t* dst = out.data<uint8_t>();
  for (int64_t img = 0; img < n; ++img) {
    for (int64_t c = 0; c < kChannels; ++c) {
      const uint8_t* plane = values.data() + (img * kChannels + c) * h * w;  // column-major
      for (int64_t col = 0; col < w; ++col) {
        for (int64_t row = 0; row < h; ++row) {
          dst[((img * h + row) * w + col) * kChannels + c] = plane[col * h + row];
        }
      }
    }
  }
  return out;
}

// y's 1..10 as 0..9 (10 is the digit 0).
Tensor map_labels(const MatArray& y, const std::string& path) {
  std::vector<int64_t> labels(static_cast<size_t>(y.numel));
  for (int64_t i = 0; i < y.numel; ++i) {
    const double v = y.value(i);
    SKA_CHECK(v >= 1 && v <= 10 && v == std::floor(v), IOError, "svhn: '", path,
              "' variable 'y' record ", i, " is ", v, "; expected a label 1..10");
    labels[i] = static_cast<int64_t>(v) % 10;
  }
  return Tensor::from_vector(labels, {y.numel});
}

}  // namespace

InMemoryDataset read_svhn_file(const std::string& path) {
  const std::vector<MatArray> arrays = read_mat_file(path);
  const MatArray& x = numeric_variable(arrays, "X", path);
  const MatArray& y = numeric_variable(arrays, "y", path);
  check_images(x, path);
  check_labels(y, x.dims[3], path);
  return InMemoryDataset("svhn", transpose_images(x, path), map_labels(y, path), 10);
}

InMemoryDataset read_svhn(const std::string& root, Split split) {
  const std::string path = root + "/" + split_name(split) + "_32x32.mat";
  SKA_CHECK(!first_existing_file({path}).empty(), IOError, "svhn: missing '", path,
            "'; expected train_32x32.mat and test_32x32.mat (SVHN format 2) in '", root,
            "'; scripts/download_data.sh svhn <dir> downloads them");
  return read_svhn_file(path);
}

}  // namespace ska::data
