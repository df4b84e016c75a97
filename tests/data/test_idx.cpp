#include <catch2/catch.hpp>

#include <sys/resource.h>
#include <zlib.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "strata/data/idx.hpp"
#include "strata/data/metrics.hpp"

#include "support/skip.hpp"
#include "support/temp_dir.hpp"

using namespace strata;
using namespace strata::data;
namespace fs = std::filesystem;

namespace {

void put_u32(std::vector<unsigned char>& out, std::uint32_t v) {
  for (int shift = 24; shift >= 0; shift -= 8)
    out.push_back(static_cast<unsigned char>(v >> shift));
}

/// IDX bytes: magic 0x000008<rank>, dims, then values.
std::vector<unsigned char> idx_bytes(std::uint32_t magic, const std::vector<std::uint32_t>& dims,
                                     const std::vector<unsigned char>& values) {
  std::vector<unsigned char> out;
  put_u32(out, magic);
  for (auto d : dims)
    put_u32(out, d);
  out.insert(out.end(), values.begin(), values.end());
  return out;
}

void write_gz(const fs::path& path, const std::vector<unsigned char>& bytes) {
  gzFile f = gzopen(path.c_str(), "wb");
  REQUIRE(f != nullptr);
  if (!bytes.empty())
    REQUIRE(gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size())) ==
            static_cast<int>(bytes.size()));
  REQUIRE(gzclose(f) == Z_OK);
}

/// A tiny Fashion-MNIST-shaped split: n images of 28 × 28 with pixel (i, p) = (i + p) % 256.
void write_split(const fs::path& dir, const std::string& prefix, std::uint32_t n,
                 std::vector<unsigned char> labels) {
  std::vector<unsigned char> pixels(std::size_t{n} * 784);
  for (std::size_t i = 0; i < pixels.size(); ++i)
    pixels[i] = static_cast<unsigned char>((i / 784 + i % 784) % 256);
  write_gz(dir / (prefix + "-images-idx3-ubyte.gz"), idx_bytes(0x803, {n, 28, 28}, pixels));
  write_gz(dir / (prefix + "-labels-idx1-ubyte.gz"),
           idx_bytes(0x801, {static_cast<std::uint32_t>(labels.size())}, labels));
}

void require_corrupt(const std::function<void()>& f, const std::string& file,
                     const std::string& says) {
  try {
    f();
    FAIL("no exception");
  } catch (const error& e) {
    CAPTURE(e.what());
    REQUIRE(e.code() == errc::corrupt_data);
    REQUIRE_THAT(e.what(), Catch::Contains(file) && Catch::Contains(says));
  }
}

}  // namespace

TEST_CASE("synthetic IDX files load with the documented normalisation", "[data][idx]") {
  const strata_test::temp_dir dir("idx");
  write_split(dir.path, "t10k", 3, {9, 0, 4});
  const auto raw = load_fashion_mnist(dir.path, mnist_split::test, false);
  REQUIRE(raw.size() == 3);
  REQUIRE(raw.images.rows() == 3);
  REQUIRE(raw.images.cols() == 784);
  REQUIRE(raw.labels == std::vector<std::uint8_t>{9, 0, 4});
  REQUIRE(raw.images(2, 300) == Approx(((2 + 300) % 256) / 255.0));
  const auto norm = load_fashion_mnist(dir.path, mnist_split::test);
  for (std::size_t i : {0u, 1000u, 2351u}) {
    const double x = raw.images.flat()[i];
    REQUIRE(norm.images.flat()[i] == Approx((x - 0.2860) / 0.3530).margin(1e-5));
  }
  // Plain (not gzipped) IDX files are read too.
  const auto plain = dir.path / "plain-labels";
  std::ofstream(plain, std::ios::binary).write("\0\0\x08\x01\0\0\0\x02\x05\x07", 10);
  REQUIRE(read_idx(plain, 1).values == std::vector<std::uint8_t>{5, 7});
}

TEST_CASE("wrong, truncated and damaged IDX files raise corrupt_data naming file and field",
          "[data][idx]") {
  const strata_test::temp_dir dir("idx");
  const auto p = dir.path / "f.gz";
  const std::string name = p.string();
  auto read1 = [&] { (void)read_idx(p, 1); };
  auto read3 = [&] { (void)read_idx(p, 3); };

  write_gz(p, idx_bytes(0x801, {4}, {1, 2, 3, 4}));
  REQUIRE(read_idx(p, 1).dims == std::vector<std::uint32_t>{4});
  require_corrupt(read3, name, "magic number 0x801 is not 0x803");  // labels read as images

  write_gz(p, idx_bytes(0x0d01, {4}, {1, 2, 3, 4}));  // type byte 0x0d (float) not supported
  require_corrupt(read1, name, "magic number 0xd01");

  write_gz(p, {0, 0});
  require_corrupt(read1, name, "magic number needs 4 bytes, only 2");

  write_gz(p, idx_bytes(0x803, {2, 28}, {}));  // header cut inside the dimensions
  require_corrupt(read3, name, "dimension 2 needs 4 bytes, only 0");

  write_gz(p, idx_bytes(0x803, {2, 28, 28}, std::vector<unsigned char>(1000)));
  require_corrupt(read3, name, "data needs 1568 bytes, only 1000");

  write_gz(p, idx_bytes(0x801, {3}, {1, 2, 3, 4}));
  require_corrupt(read1, name, "trailing bytes");

  write_gz(p, idx_bytes(0x803, {0, 28, 28}, {}));
  require_corrupt(read3, name, "dimension 0 = 0");

  write_gz(p, idx_bytes(0x803, {65536, 65536, 28}, {}));
  require_corrupt(read3, name, "dimension 2 = 28 is implausible");

  // A gzip stream whose compressed data was damaged.
  std::vector<unsigned char> big(100000);
  for (std::size_t i = 0; i < big.size(); ++i)
    big[i] = static_cast<unsigned char>(i * 7919 % 251);
  write_gz(p, idx_bytes(0x801, {100000}, big));
  {
    std::fstream f(p, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(200);
    const char junk[64] = {'\x13', '\x37', '\x7f', '\x00', '\xff'};
    f.write(junk, sizeof junk);
  }
  try {
    (void)read_idx(p, 1);
    FAIL("no exception");
  } catch (const error& e) {
    REQUIRE(e.code() == errc::corrupt_data);
    REQUIRE_THAT(e.what(), Catch::Contains(name));
  }

  try {
    (void)read_idx(dir.path / "absent.gz", 1);
    FAIL("no exception");
  } catch (const error& e) {
    REQUIRE(e.code() == errc::io_error);
    REQUIRE_THAT(e.what(), Catch::Contains("absent.gz"));
  }
}

// Found by tests/fuzz/fuzz_idx (corpus/idx/regress-oom-huge-dimension): a header announcing
// 2^32 - 1 values made read_idx allocate and zero 4 GiB before it found the file truncated.
TEST_CASE("a header announcing 2^32 values on a short file is refused, not allocated",
          "[data][idx]") {
  const strata_test::temp_dir dir("idx");
  const auto p = dir.path / "huge.gz";
  const auto peak_kib = [] {
    rusage usage{};
    getrusage(RUSAGE_SELF, &usage);
    return static_cast<long>(usage.ru_maxrss);
  };
  const long before = peak_kib();
  for (const bool gz : {true, false}) {
    const auto bytes = idx_bytes(0x801, {0xffffffffu}, {1, 2, 3, 4});
    if (gz)
      write_gz(p, bytes);
    else
      std::ofstream(p, std::ios::binary)
          .write(reinterpret_cast<const char*>(bytes.data()),
                 static_cast<std::streamsize>(bytes.size()));
    require_corrupt([&] { (void)read_idx(p, 1); }, p.string(),
                    "data needs 4294967295 bytes, only 4 present");
    write_gz(p, idx_bytes(0x803, {65536, 65536, 1}, {7}));
    require_corrupt([&] { (void)read_idx(p, 3); }, p.string(),
                    "data needs 4294967296 bytes, only 1 present");
  }
  REQUIRE(peak_kib() - before < 256 * 1024);  // the old reader's peak grew by 4 GiB
}

TEST_CASE("Fashion-MNIST checks: image size, counts, label range, missing files", "[data][idx]") {
  const strata_test::temp_dir dir("idx");
  const auto images = (dir.path / "train-images-idx3-ubyte.gz").string();
  const auto labels = (dir.path / "train-labels-idx1-ubyte.gz").string();
  try {
    (void)load_fashion_mnist(dir.path);
    FAIL("no exception");
  } catch (const error& e) {
    REQUIRE(e.code() == errc::io_error);
    REQUIRE_THAT(e.what(), Catch::Contains(images) && Catch::Contains("dataset-fashion-mnist"));
  }
  write_split(dir.path, "train", 3, {1, 2});  // 3 images, 2 labels
  require_corrupt([&] { (void)load_fashion_mnist(dir.path); }, labels, "2 labels");
  write_split(dir.path, "train", 2, {1, 10});
  require_corrupt([&] { (void)load_fashion_mnist(dir.path); }, labels, "label 1 = 10");
  write_gz(dir.path / "train-images-idx3-ubyte.gz",
           idx_bytes(0x803, {1, 32, 32}, std::vector<unsigned char>(1024)));
  write_gz(dir.path / "train-labels-idx1-ubyte.gz", idx_bytes(0x801, {1}, {3}));
  require_corrupt([&] { (void)load_fashion_mnist(dir.path); }, images, "32 x 32");
}

TEST_CASE("the real Fashion-MNIST files (when installed)", "[data][idx][dataset]") {
  if (!fs::exists(fashion_mnist_dir / "train-images-idx3-ubyte.gz")) {
    strata_test::skip(fashion_mnist_dir.string() +
                      " absent; apt-get install dataset-fashion-mnist to run this test");
    return;
  }
  const auto train = load_fashion_mnist(fashion_mnist_dir, mnist_split::train, false);
  const auto test = load_fashion_mnist(fashion_mnist_dir, mnist_split::test);
  REQUIRE(train.size() == 60000);
  REQUIRE(test.size() == 10000);
  REQUIRE(test.images.rows() == 10000);
  std::vector<std::size_t> per_class(10, 0);
  for (auto y : train.labels)
    ++per_class[y];
  REQUIRE(per_class == std::vector<std::size_t>(10, 6000));
  // The stated normalisation constants are the training set's pixel mean and std.
  double sum = 0, sum_sq = 0;
  for (float x : train.images.flat()) {
    sum += x;
    sum_sq += static_cast<double>(x) * x;
  }
  const double count = static_cast<double>(train.images.size());
  const double mean = sum / count;
  const double sd = std::sqrt(sum_sq / count - mean * mean);
  REQUIRE(mean == Approx(fashion_mnist_mean).margin(5e-4));
  REQUIRE(sd == Approx(fashion_mnist_std).margin(5e-4));
  // Normalised test images: mean near 0, spread near 1.
  double tsum = 0;
  for (float x : test.images.flat())
    tsum += x;
  REQUIRE(std::abs(tsum / static_cast<double>(test.images.size())) < 0.05);
  // First training label of Fashion-MNIST is 9 (ankle boot), first test label 9 as well.
  REQUIRE(train.labels[0] == 9);
  REQUIRE(test.labels[0] == 9);
}
