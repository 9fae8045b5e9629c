// The data loader: deterministic shuffles, sharding, resume positions and worker equivalence.
#include <catch2/catch.hpp>
#include <algorithm>
#include <cstdint>
#include <set>

#include "data/pipeline/loader.h"
#include "data/transforms/augment_factory.h"

using namespace ska;
using namespace ska::data;

namespace {

// N images of 4x4x1 whose pixels all equal (index % 251), labels index % 10.
data::InMemoryDataset numbered_dataset(int64_t n) {
  Tensor images = Tensor::empty({n, 4, 4, 1}, DType::kU8);
  Tensor labels = Tensor::empty({n}, DType::kI64);
  for (int64_t i = 0; i < n; ++i) {
    std::fill(images.data<uint8_t>() + i * 16, images.data<uint8_t>() + (i + 1) * 16,
              static_cast<uint8_t>(i % 251));
    labels.data<int64_t>()[i] = i % 10;
  }
  return data::InMemoryDataset("numbered", images, labels, 10);
}

LoaderOptions plain(int64_t batch, int workers) {
  LoaderOptions o;
  o.batch_size = batch;
  o.workers = workers;
  o.seed = 11;
  o.mean = {0.0};
  o.std = {1.0 / 255.0};  // pixels come out as their byte values
  return o;
}

std::vector<std::vector<float>> epoch_batches(DataLoader& loader, int64_t epoch, int64_t start = 0) {
  loader.start_epoch(epoch, start);
  std::vector<std::vector<float>> out;
  Batch b;
  while (loader.next(b)) out.push_back(b.images.to_vector<float>());
  return out;
}

}  // namespace

TEST_CASE("epoch_permutation is a deterministic permutation per (seed, epoch)", "[cpu][train]") {
  const auto p = epoch_permutation(1000, 5, 0);
  std::vector<int64_t> sorted = p;
  std::sort(sorted.begin(), sorted.end());
  for (int64_t i = 0; i < 1000; ++i) REQUIRE(sorted[i] == i);
  REQUIRE(p == epoch_permutation(1000, 5, 0));
  REQUIRE(p != epoch_permutation(1000, 5, 1));
  REQUIRE(p != epoch_permutation(1000, 6, 0));
  // Small sizes are permutations too, and repeatable.
  const auto small = epoch_permutation(8, 42, 3);
  REQUIRE(small == epoch_permutation(8, 42, 3));
  REQUIRE(std::set<int64_t>(small.begin(), small.end()).size() == 8);
}

TEST_CASE("shard_indices splits an epoch between ranks like DistributedSampler", "[cpu][train]") {
  std::vector<int64_t> order(10);
  for (int i = 0; i < 10; ++i) order[i] = 100 + i;
  // drop_last: 3 per rank, disjoint.
  std::set<int64_t> seen;
  for (int r = 0; r < 3; ++r) {
    const auto s = shard_indices(order, r, 3, true);
    REQUIRE(s.size() == 3);
    for (int64_t v : s) REQUIRE(seen.insert(v).second);
  }
  REQUIRE(shard_indices(order, 1, 3, true) == std::vector<int64_t>{101, 104, 107});
  // padded: 4 per rank, every index covered, rank 2 wraps to the start.
  seen.clear();
  for (int r = 0; r < 3; ++r) {
    const auto s = shard_indices(order, r, 3, false);
    REQUIRE(s.size() == 4);
    seen.insert(s.begin(), s.end());
  }
  REQUIRE(seen.size() == 10);
  REQUIRE(shard_indices(order, 2, 3, false).back() == 101);  // padded with order[0], order[1]
  REQUIRE_THROWS_AS(shard_indices(order, 3, 3, true), ValueError);
}

TEST_CASE("DataLoader: same batches with or without workers, every epoch reproducible",
          "[cpu][train]") {
  const auto ds = numbered_dataset(103);
  DataLoader serial(ds, plain(10, 0));
  DataLoader threaded(ds, plain(10, 3));
  REQUIRE(serial.batches_per_epoch() == 10);  // drop_last
  const auto a = epoch_batches(serial, 2), b = epoch_batches(threaded, 2);
  REQUIRE(a.size() == 10);
  REQUIRE(a == b);
  REQUIRE(epoch_batches(threaded, 2) == a);  // the same epoch again
  REQUIRE(epoch_batches(threaded, 3) != a);  // another epoch, another order
  // Every batch holds distinct samples, and images are normalised (x/255 - 0)/(1/255) = x.
  std::set<float> firsts;
  for (const auto& batch : a) {
    for (size_t i = 0; i < batch.size(); i += 16) REQUIRE(firsts.insert(batch[i]).second);
  }
}

TEST_CASE("DataLoader resumes mid-epoch with the batches the full epoch would give",
          "[cpu][train]") {
  const auto ds = numbered_dataset(64);
  LoaderOptions o = plain(8, 2);
  o.transform = data::read_train_augment(
                    Config::parse("augment: {crop_padding: 1, hflip: 0.5}").root(), 4, 1, 10, {0.0})
                    .transform;  // augmentation is per sample too
  DataLoader loader(ds, o);
  const auto full = epoch_batches(loader, 4);
  const auto tail = epoch_batches(loader, 4, 5);
  REQUIRE(tail.size() == 3);
  for (size_t i = 0; i < tail.size(); ++i) REQUIRE(tail[i] == full[5 + i]);
  REQUIRE(epoch_batches(loader, 4, 8).empty());
  REQUIRE_THROWS_AS(loader.start_epoch(4, 9), ValueError);
}

TEST_CASE("DataLoader evaluation order and sharded ranks", "[cpu][train]") {
  const auto ds = numbered_dataset(25);
  LoaderOptions o = plain(10, 1);
  o.shuffle = false;
  o.drop_last = false;
  DataLoader eval(ds, o);
  REQUIRE(eval.batches_per_epoch() == 3);
  const auto batches = epoch_batches(eval, 0);
  REQUIRE(batches.back().size() == 5 * 16);  // the last partial batch is kept
  REQUIRE(batches[0][0] == 0.0f);
  REQUIRE(batches[2][4 * 16] == 24.0f);
  // Two training ranks see disjoint halves of the shuffled epoch.
  LoaderOptions r0 = plain(4, 0), r1 = plain(4, 0);
  r0.world_size = r1.world_size = 2;
  r1.rank = 1;
  DataLoader l0(ds, r0), l1(ds, r1);
  REQUIRE(l0.samples_per_epoch() == 12);
  std::set<float> s0, s1;
  for (const auto& b : epoch_batches(l0, 1)) for (size_t i = 0; i < b.size(); i += 16) s0.insert(b[i]);
  for (const auto& b : epoch_batches(l1, 1)) for (size_t i = 0; i < b.size(); i += 16) s1.insert(b[i]);
  REQUIRE(s0.size() == 12);
  REQUIRE(s1.size() == 12);
  for (float v : s0) REQUIRE(s1.count(v) == 0);
}
