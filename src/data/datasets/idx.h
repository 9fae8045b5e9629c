// IDX files (the MNIST family's format) and Fashion-MNIST: a big-endian magic (0x00000803 images,
// 0x00000801 labels), big-endian dims, then unsigned bytes; plain or gzip-compressed.
#pragma once

#include <cstdint>
#include <string>

#include "data/datasets/dataset.h"

namespace ska::data {

// Where Debian's dataset-fashion-mnist package installs the four .gz files.
constexpr const char* kFashionMnistDebianDir = "/usr/share/datasets/fashion-mnist";

// An images file [N, rows, cols] and a labels file [N] as a [N, rows, cols, 1] dataset. IOError
// naming the file, the offset or record and what was expected for: wrong magic, dims whose product
// overflows or exceeds 4 GiB, a header or data shorter or longer than the dims say (a gzip stream
// is decompressed no further than the dims announce, plus one byte), a corrupt gzip stream, image
// and label counts that differ, and labels outside [0, num_classes).
InMemoryDataset read_idx_dataset(const std::string& images_path, const std::string& labels_path,
                                 const std::string& name, int64_t num_classes);

// `root` holds {train,t10k}-{images-idx3,labels-idx1}-ubyte, each plain or with .gz ("" means
// kFashionMnistDebianDir). Images stay 28x28x1 as stored; pad_and_replicate makes the paper's
// 32x32x3 layout.
InMemoryDataset read_fashion_mnist(const std::string& root, Split split);

}  // namespace ska::data
