// CIFAR-10 and CIFAR-100 in their official binary versions (cifar-10-binary.tar.gz,
// cifar-100-binary.tar.gz): fixed-size records of label byte(s) + 3072 pixel bytes in CHW planes.
#pragma once

#include <string>

#include "data/datasets/dataset.h"

namespace ska::data {

// `root` holds data_batch_1..5.bin and test_batch.bin (or holds cifar-10-batches-bin/ with them).
// Records: 1 label byte in [0, 10), then the 32x32 R, G and B planes.
InMemoryDataset read_cifar10(const std::string& root, Split split);

// `root` holds train.bin and test.bin (or holds cifar-100-binary/ with them). Records: coarse
// label byte in [0, 20), fine label byte in [0, 100) (the label used), then the 3072 pixels.
InMemoryDataset read_cifar100(const std::string& root, Split split);

// Both throw IOError naming the file, the record and its offset, and what was expected, for a
// missing file, a size that is not a whole number of records (truncation), an empty file, or a
// label out of range.

}  // namespace ska::data
