// SVHN (format 2, cropped 32x32 digits): train_32x32.mat and test_32x32.mat, MATLAB level-5 files
// with X uint8 [32, 32, 3, N] (column-major) and y [N, 1] in 1..10, where 10 is the digit 0.
#pragma once

#include <string>

#include "data/datasets/dataset.h"

namespace ska::data {

// `root` holds train_32x32.mat and test_32x32.mat (the extra split is not used by the paper).
InMemoryDataset read_svhn(const std::string& root, Split split);

// One file: finds the variables "X" and "y" by name (other variables are ignored), transposes X
// to [N, H, W, 3] and maps label 10 to 0. IOError naming the file and the variable for the MAT
// errors of read_mat_file, a missing X or y, complex or non-numeric arrays, X not 4-D with 3
// channels, y not [N, 1] with X's N, pixels outside 0..255 and labels outside 1..10 (with the
// record index).
InMemoryDataset read_svhn_file(const std::string& path);

}  // namespace ska::data
