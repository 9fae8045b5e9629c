// benchmark_loader: how many training images per second the input pipeline makes from JPEG
// folders (ImageNet), per thread and with N worker threads: decoding alone, one thread's whole
// sample (decode, the config's augmentation, normalisation; then again with every JPEG decoded
// whole rather than only RandomResizedCrop's window), the DataLoader at each worker
// count, and one thread's evaluation samples (the eval transform). With no --images it writes a
// synthetic ImageNet-like folder first (JPEGs of ImageNet's typical sizes and file sizes). Files
// are read from the page cache after the first pass, so this measures CPU cost, not the disk.
// Usage: benchmark_loader [--config imagenet_caformer_s18] [--images DIR] [--synthetic 256]
//                         [--workers 1,2,4,8,16] [--seconds 10] [--target 1000] [--json]
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "app_common.h"
#include "data/datasets/file_bytes.h"
#include "data/datasets/image_decode.h"
#include "data/datasets/image_folder.h"
#include "data/pipeline/loader.h"
#include "io/atomic_file.h"
#include "train/options.h"
#include "train/run_data.h"

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

struct LoaderBenchOptions {
  ska::apps::ConfigOptions config;
  std::string images;       // a folder of <class>/<image> (or with train/): none, synthetic
  int64_t synthetic = 256;  // images written when --images is not given
  std::vector<int> workers;
  int64_t batch = 0;     // 0: the config's data.batch_size
  double seconds = 10;   // timed per worker count, after the first batches
  double target = 1000;  // images/s one GPU consumes, for the "workers needed" line
  bool keep = false;
  bool json = false;
};

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// The CPU time this process has used, every thread's: for a phase on one thread, its own cost,
// which a busy machine inflates far less than the wall-clock time.
double cpu_seconds() {
  timespec t{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

// The sizes ImageNet's training images mostly have (width x height), in rotation.
constexpr int kSizes[][2] = {{500, 375}, {500, 333}, {375, 500},
                             {500, 400}, {500, 500}, {400, 500}};

// One synthetic photograph: smooth colour fields, a few discs and texture noise, so that JPEG at
// quality 90 gives ImageNet's typical file size (about 110 KB at 500x375) and decoding does the
// same entropy-decoding work per pixel.
std::vector<uint8_t> synthetic_pixels(int height, int width, uint64_t seed) {
  std::mt19937_64 rng(seed);
  auto unit = [&] { return static_cast<double>(rng() >> 11) * 0x1.0p-53; };
  auto uniform = [&](double lo, double hi) { return lo + (hi - lo) * unit(); };
  double phase[3], freq[3], discs[6][4];
  for (int c = 0; c < 3; ++c) {
    phase[c] = uniform(0, 6.28);
    freq[c] = uniform(0.005, 0.03);
  }
  for (auto& d : discs) {
    d[0] = uniform(0, width);
    d[1] = uniform(0, height);
    d[2] = uniform(20, 120);
    d[3] = uniform(-80, 80);
  }
  std::vector<uint8_t> rgb(static_cast<size_t>(height) * width * 3);
  for (int y = 0; y < height; ++y) {
    for (int x = 0; x < width; ++x) {
      double shift = 0;
      for (const auto& d : discs) {
        if (std::hypot(x - d[0], y - d[1]) < d[2]) shift += d[3];
      }
      for (int c = 0; c < 3; ++c) {
        const double field = 128 + 70 * std::sin(freq[c] * (x + 1.3 * y) + phase[c]);
        const double texture = 64 * (unit() - 0.5) + 14 * std::sin(0.9 * x + 0.7 * y);
        rgb[(static_cast<size_t>(y) * width + x) * 3 + c] =
            static_cast<uint8_t>(std::clamp(field + shift + texture, 0.0, 255.0));
      }
    }
  }
  return rgb;
}

// Writes `count` JPEGs into dir/train/<class>/ (10 classes); returns the mean file size in bytes.
double write_synthetic(const std::string& dir, int64_t count) {
  double bytes = 0;
  for (int64_t i = 0; i < count; ++i) {
    const int width = kSizes[i % 6][0], height = kSizes[i % 6][1];
    const std::string folder = dir + "/train/c" + std::to_string(i % 10);
    fs::create_directories(folder);
    const std::vector<uint8_t> rgb = synthetic_pixels(height, width, 1000 + i);
    const std::vector<uint8_t> file = ska::data::encode_jpeg_rgb(rgb.data(), height, width, 90);
    ska::io::write_file_atomic(folder + "/" + std::to_string(i) + ".JPEG",
                               std::string(file.begin(), file.end()));
    bytes += static_cast<double>(file.size());
  }
  return bytes / static_cast<double>(count);
}

struct Row {
  int workers;
  double images_per_s;
};

int run(const LoaderBenchOptions& o) {
  using namespace ska;
  Config config = apps::load_config(o.config);
  const ConfigNode model = apps::model_section(config);
  const models::ModelInput input = apps::model_input(model);
  apps::mark_read(model);  // the model is not built
  train::DataOptions data = train::DataOptions::from_config(config.root()["data"], input.image_size,
                                                            input.in_channels, input.num_classes);
  config.check_unused();
  std::string root = o.images;
  double mean_file_bytes = 0;
  const bool synthetic = root.empty();
  struct RemoveAtEnd {  // the synthetic folder, however the run ends (unless --keep)
    std::string dir;
    ~RemoveAtEnd() {
      std::error_code ignored;
      if (!dir.empty()) fs::remove_all(dir, ignored);
    }
  } remove_at_end;
  if (synthetic) {
    root =
        (fs::temp_directory_path() / ("ska_loader_bench_" + std::to_string(::getpid()))).string();
    if (!o.keep) remove_at_end.dir = root;
    std::fprintf(stderr, "writing %lld synthetic JPEGs to %s\n",
                 static_cast<long long>(o.synthetic), root.c_str());
    mean_file_bytes = write_synthetic(root, o.synthetic);
  }
  const std::string folder = fs::is_directory(root + "/train") ? root + "/train" : root;
  auto scanned = std::make_unique<data::ImageFolderDataset>(
      data::scan_image_folder(folder, "images", data::list_class_folders(folder)));
  const data::ImageFolderDataset& images = *scanned;
  if (!synthetic) {
    for (const data::FolderSample& s : images.samples()) mean_file_bytes += fs::file_size(s.path);
    mean_file_bytes /= static_cast<double>(images.size());
  }

  // 1. Decoding alone, one thread (a first pass warms the page cache).
  for (int64_t i = 0; i < images.size(); ++i) data::decode_image_rgb(images.samples()[i].path);
  double pixels = 0;
  const Clock::time_point decode_start = Clock::now();
  const double decode_cpu_start = cpu_seconds();
  for (int64_t i = 0; i < images.size(); ++i) {
    const Tensor rgb = data::decode_image_rgb(images.samples()[i].path);
    pixels += static_cast<double>(rgb.size(0) * rgb.size(1));
  }
  const double decode_rate = static_cast<double>(images.size()) / seconds_since(decode_start);
  const double decode_cpu_ms =
      1e3 * (cpu_seconds() - decode_cpu_start) / static_cast<double>(images.size());

  // 2. and 3. Whole training samples: one thread, then the DataLoader with each worker count;
  // 4. evaluation samples (the eval transform: shorter side to 224 / crop_pct, centre crop).
  const int max_workers = *std::max_element(o.workers.begin(), o.workers.end());
  const int64_t batch = o.batch > 0 ? o.batch : data.batch_size;
  // The folder's images repeated: enough batches for many workers from a small folder.
  std::vector<int64_t> order(static_cast<size_t>(
      images.size() * std::max<int64_t>(1, 64 * batch * max_workers / images.size())));
  for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int64_t>(i) % images.size();
  const data::SubsetDataset repeated(std::move(scanned), std::move(order));
  data::LoaderOptions train_loader = train::train_loader_options(data, repeated, 42);
  data::LoaderOptions eval_loader = train::eval_loader_options(data, repeated);
  train_loader.batch_size = eval_loader.batch_size = batch;
  struct Rate {
    double images_per_s, cpu_ms_per_image;  // the latter: the process's CPU time, every thread's
  };
  auto rate_with = [&](data::LoaderOptions loader, int workers) -> Rate {
    loader.workers = workers;
    loader.prefetch = std::max(4, workers);
    data::DataLoader pipeline(repeated, loader);
    pipeline.start_epoch(0);
    data::Batch b;
    for (int i = 0; i < std::max(1, workers); ++i) pipeline.next(b);  // workers started, queue full
    int64_t made = 0;
    const Clock::time_point start = Clock::now();
    const double cpu_start = cpu_seconds();
    while (seconds_since(start) < o.seconds && pipeline.next(b)) made += b.images.size(0);
    const double n = static_cast<double>(std::max<int64_t>(made, 1));
    return {static_cast<double>(made) / seconds_since(start),
            1e3 * (cpu_seconds() - cpu_start) / n};
  };
  const Rate sample = rate_with(train_loader, 0);
  const double sample_rate = sample.images_per_s;
  data::LoaderOptions whole_images = train_loader;  // the same samples, every JPEG decoded whole
  whole_images.decode_windows = false;
  const Rate sample_whole = rate_with(whole_images, 0);
  std::vector<Row> rows;
  for (int w : o.workers) rows.push_back({w, rate_with(train_loader, w).images_per_s});
  const Rate eval = rate_with(eval_loader, 0);
  const double eval_rate = eval.images_per_s;

  const double per_worker = rows.back().images_per_s / rows.back().workers;
  const int needed = static_cast<int>(std::ceil(o.target / per_worker));
  if (o.json) {
    nlohmann::json j = {{"images", images.size()},
                        {"synthetic", synthetic},
                        {"mean_file_kb", mean_file_bytes / 1000},
                        {"mean_megapixels", pixels / static_cast<double>(images.size()) / 1e6},
                        {"image_size", input.image_size},
                        {"batch", batch},
                        {"cores", std::thread::hardware_concurrency()},
                        {"decode_images_per_s", decode_rate},
                        {"decode_cpu_ms", decode_cpu_ms},
                        {"sample_images_per_s", sample_rate},
                        {"sample_cpu_ms", sample.cpu_ms_per_image},
                        {"sample_whole_images_per_s", sample_whole.images_per_s},
                        {"sample_whole_cpu_ms", sample_whole.cpu_ms_per_image},
                        {"eval_images_per_s", eval_rate},
                        {"eval_cpu_ms", eval.cpu_ms_per_image},
                        {"target_images_per_s", o.target},
                        {"workers_needed", needed}};
    for (const Row& r : rows) {
      j["loader"].push_back({{"workers", r.workers}, {"images_per_s", r.images_per_s}});
    }
    std::printf("%s\n", j.dump(2).c_str());
  } else {
    std::printf("# %lld %sJPEGs, %.0f KB and %.2f Mpixel on average; %u cores; batch %lld\n",
                static_cast<long long>(images.size()), synthetic ? "synthetic " : "",
                mean_file_bytes / 1000, pixels / static_cast<double>(images.size()) / 1e6,
                std::thread::hardware_concurrency(), static_cast<long long>(batch));
    std::printf("decode only, 1 thread:                %8.1f images/s (%.3f CPU ms each)\n",
                decode_rate, decode_cpu_ms);
    std::printf("decode + augment (%lldpx), 1 thread:  %8.1f images/s (%.3f CPU ms each)\n",
                static_cast<long long>(input.image_size), sample_rate, sample.cpu_ms_per_image);
    std::printf("  the same, JPEGs decoded whole:       %8.1f images/s (%.3f CPU ms each)\n",
                sample_whole.images_per_s, sample_whole.cpu_ms_per_image);
    for (const Row& r : rows) {
      std::printf("DataLoader, %2d workers:               %8.1f images/s (%.1f per worker)\n",
                  r.workers, r.images_per_s, r.images_per_s / r.workers);
    }
    std::printf("evaluation (eval transform), 1 thread: %7.1f images/s (%.3f CPU ms each)\n",
                eval_rate, eval.cpu_ms_per_image);
    std::printf("workers for %.0f images/s per GPU:      %d (at %.1f images/s per worker)\n",
                o.target, needed, per_worker);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  LoaderBenchOptions o;
  o.config.config = "imagenet_caformer_s18";
  CLI::App app{"Input pipeline throughput on JPEG folders: decode, augment, N worker threads"};
  ska::apps::add_config_options(app, o.config);
  app.get_option("--config")->required(false)->default_str("imagenet_caformer_s18");
  app.add_option("--images", o.images,
                 "a folder of <class>/<image> files (or DIR/train/<class>/...); default: "
                 "synthetic JPEGs");
  app.add_option("--synthetic", o.synthetic, "synthetic JPEGs to write without --images")
      ->check(ska::apps::integer_in(1, 100000));
  app.add_option("--workers", o.workers, "worker counts to measure, e.g. 1,2,4,8,16")
      ->delimiter(',')
      ->check(CLI::Range(1, 1024));
  app.add_option("--batch", o.batch, "images per batch (default: the config's data.batch_size)")
      ->check(ska::apps::integer_in(1, ska::apps::kMaxBatch));
  app.add_option("--seconds", o.seconds, "timed seconds per worker count")
      ->check(ska::apps::number_above(0.0));
  app.add_option("--target", o.target, "images/s one GPU consumes (the 'workers needed' line)")
      ->check(ska::apps::number_above(0.0));
  app.add_flag("--keep", o.keep, "keep the synthetic folder (its path is printed)");
  app.add_flag("--json", o.json, "print one JSON object");
  return ska::apps::run_main(app, argc, argv, [&] {
    if (o.workers.empty()) {
      const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
      for (int w = 1; w < cores; w *= 2) o.workers.push_back(w);
      o.workers.push_back(cores);
    }
    return run(o);
  });
}
