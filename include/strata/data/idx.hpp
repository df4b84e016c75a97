/// @file idx.hpp
/// Reader of gzip-compressed IDX files (the MNIST / Fashion-MNIST format) and a loader of
/// Fashion-MNIST as normalised float images. Needs zlib (`strata::strata` links ZLIB::ZLIB when
/// CMake finds it).
///
/// ```cpp
/// auto train = strata::data::load_fashion_mnist();               // 60000 × 784, labels 0..9
/// auto test = strata::data::load_fashion_mnist(strata::data::fashion_mnist_dir,
///                                              strata::data::mnist_split::test);
/// ```
#pragma once

#if !__has_include(<zlib.h>)
#error "strata/data/idx.hpp needs zlib (zlib.h not found): install zlib1g-dev / zlib-devel"
#endif

#include <zlib.h>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "strata/core/error.hpp"
#include "strata/core/matrix.hpp"

namespace strata::data {

/// An IDX array of unsigned bytes: `dims` (outermost first) and the values, row-major.
struct idx_array {
  std::vector<std::uint32_t> dims;
  std::vector<std::uint8_t> values;
};

namespace detail {

class gz_file {
 public:
  explicit gz_file(const std::filesystem::path& path) : path_(path.string()) {
    std::error_code ec;
    if (!std::filesystem::is_regular_file(path, ec))
      fail(errc::io_error, cat("idx: '", path_, "' does not exist or is not a regular file"));
    file_ = gzopen(path_.c_str(), "rb");
    if (file_ == nullptr)
      fail(errc::io_error, cat("idx: cannot open '", path_, "' (gzopen failed)"));
  }
  gz_file(const gz_file&) = delete;
  gz_file& operator=(const gz_file&) = delete;
  ~gz_file() {
    if (file_ != nullptr) gzclose(file_);
  }

  /// Reads up to `size` bytes; returns how many (fewer only at the end of the data).
  std::size_t read(void* out, std::size_t size, std::string_view field) {
    auto* p = static_cast<unsigned char*>(out);
    std::size_t total = 0;
    while (total < size) {
      const auto want =
          static_cast<unsigned>(std::min<std::size_t>(size - total, std::size_t{1} << 30));
      const int got = gzread(file_, p + total, want);
      if (got < 0) {
        int code = 0;
        const char* msg = gzerror(file_, &code);
        fail(errc::corrupt_data, cat("idx: '", path_, "': cannot decompress ", field, ": ",
                                     msg != nullptr ? msg : "unknown zlib error",
                                     "; the file is damaged, download it again"));
      }
      if (got == 0) break;
      total += static_cast<std::size_t>(got);
    }
    return total;
  }
  /// Reads exactly `size` bytes of `field` or raises corrupt_data.
  void read_exact(void* out, std::size_t size, std::string_view field) {
    const std::size_t got = read(out, size, field);
    if (got != size)
      fail(errc::corrupt_data, cat("idx: '", path_, "' is truncated: ", field, " needs ", size,
                                   " bytes, only ", got, " present"));
  }
  [[nodiscard]] const std::string& path() const noexcept { return path_; }

 private:
  std::string path_;
  gzFile file_ = nullptr;
};

inline std::uint32_t big_endian(const std::array<unsigned char, 4>& b) noexcept {
  return (std::uint32_t{b[0]} << 24) | (std::uint32_t{b[1]} << 16) | (std::uint32_t{b[2]} << 8) |
         std::uint32_t{b[3]};
}

}  // namespace detail

/// Most values `read_idx` accepts from one file (a guard against a corrupt header asking for
/// terabytes).
inline constexpr std::uint64_t idx_max_values = std::uint64_t{1} << 32;

/// Reads a (gzip or plain) IDX file of unsigned bytes and checks it: magic 0x000008NN with
/// NN = `expected_rank` dimensions (0x00000801 labels, 0x00000803 images), every dimension
/// non-zero, exactly Π dims value bytes and nothing after them. A violation raises
/// `errc::corrupt_data` naming the file and the field; a missing file `errc::io_error`.
/// Cost: one pass over the file; memory about what the file holds, whatever its header
/// announces. Thread-safe (no shared state).
inline idx_array read_idx(const std::filesystem::path& path, std::size_t expected_rank) {
  detail::gz_file file(path);
  std::array<unsigned char, 4> word{};
  file.read_exact(word.data(), 4, "magic number");
  const std::uint32_t magic = detail::big_endian(word);
  const std::uint32_t expected = 0x00000800u | static_cast<std::uint32_t>(expected_rank);
  if (magic != expected)
    fail(errc::corrupt_data,
         cat("idx: '", file.path(), "': magic number 0x", std::hex, magic, " is not 0x", expected,
             std::dec, " (unsigned bytes, ", expected_rank,
             " dimensions); is this the right file (images vs labels)?"));
  idx_array out;
  std::uint64_t count = 1;
  for (std::size_t d = 0; d < expected_rank; ++d) {
    const std::string field = cat("dimension ", d);
    file.read_exact(word.data(), 4, field);
    const std::uint32_t size = detail::big_endian(word);
    if (size == 0 || count * size > idx_max_values)
      fail(errc::corrupt_data,
           cat("idx: '", file.path(), "': ", field, " = ", size,
               " is implausible (zero, or more than ", idx_max_values, " values in all)"));
    count *= size;
    out.dims.push_back(size);
  }
  // The values are read in pieces, the buffer growing only with bytes actually present: a
  // header announcing up to idx_max_values values on a short or damaged file is refused as
  // truncated after allocating about what the file holds, not 4 GiB up front.
  constexpr std::uint64_t piece = std::uint64_t{1} << 16;
  std::uint64_t have = 0;
  while (have < count) {
    const std::uint64_t want = std::min(piece, count - have);
    out.values.reserve(static_cast<std::size_t>(std::min(count, std::max(2 * have, piece))));
    out.values.resize(static_cast<std::size_t>(have + want));
    const std::size_t got =
        file.read(out.values.data() + have, static_cast<std::size_t>(want), "data");
    have += got;
    if (got != want)
      fail(errc::corrupt_data,
           cat("idx: '", file.path(), "' is truncated: data needs ", count, " bytes, only ", have,
               " present; the file is incomplete or its header damaged, download it again"));
  }
  unsigned char extra = 0;
  if (file.read(&extra, 1, "trailing data") != 0)
    fail(errc::corrupt_data, cat("idx: '", file.path(), "': trailing bytes after the ", count,
                                 " data values the header announces"));
  return out;
}

/// Where the Debian package `dataset-fashion-mnist` installs the files.
inline const std::filesystem::path fashion_mnist_dir = "/usr/share/datasets/fashion-mnist";

/// Per-pixel mean and standard deviation of the Fashion-MNIST training images scaled to
/// [0, 1] (over all 60000 × 784 pixels); used to normalise both splits.
inline constexpr float fashion_mnist_mean = 0.2860f;
inline constexpr float fashion_mnist_std = 0.3530f;
/// The normalised value of a black (0) pixel: what zero padding is for normalised images.
inline constexpr float fashion_mnist_black = -fashion_mnist_mean / fashion_mnist_std;

/// Which half of an MNIST-style dataset.
enum class mnist_split { train, test };

/// Images and labels of an MNIST-style dataset. `images` is n × (height · width), row-major
/// pixels, each (x / 255 − mean) / std (or x / 255 when loaded without normalisation).
struct image_dataset {
  matrix<float> images;
  std::vector<std::uint8_t> labels;
  std::size_t height = 0;
  std::size_t width = 0;
  std::size_t classes = 0;
  [[nodiscard]] std::size_t size() const noexcept { return labels.size(); }
};

/// Loads Fashion-MNIST from `dir` (`train-images-idx3-ubyte.gz`, `train-labels-idx1-ubyte.gz`,
/// `t10k-…` for the test split). Checks magic numbers, 28 × 28 images, equal image and label
/// counts and labels in 0..9 (`errc::corrupt_data` naming file and field). Pixels become
/// (x / 255 − 0.2860) / 0.3530 when `normalize`, else x / 255. Cost: one pass, ~200 MB
/// floats for the training split. Thread-safe.
inline image_dataset load_fashion_mnist(const std::filesystem::path& dir = fashion_mnist_dir,
                                        mnist_split split = mnist_split::train,
                                        bool normalize = true) {
  const std::string prefix = split == mnist_split::train ? "train" : "t10k";
  const auto image_path = dir / (prefix + "-images-idx3-ubyte.gz");
  const auto label_path = dir / (prefix + "-labels-idx1-ubyte.gz");
  for (const auto& p : {image_path, label_path}) {
    std::error_code ec;
    if (!std::filesystem::exists(p, ec))
      fail(errc::io_error, cat("load_fashion_mnist: '", p.string(),
                               "' not found; install the Debian package dataset-fashion-mnist "
                               "or pass the folder holding the IDX .gz files"));
  }
  const idx_array images = read_idx(image_path, 3);
  const idx_array labels = read_idx(label_path, 1);
  if (images.dims[1] != 28 || images.dims[2] != 28)
    fail(errc::corrupt_data, cat("load_fashion_mnist: '", image_path.string(), "': images are ",
                                 images.dims[1], " x ", images.dims[2], ", expected 28 x 28"));
  if (images.dims[0] != labels.dims[0])
    fail(errc::corrupt_data,
         cat("load_fashion_mnist: '", image_path.string(), "' holds ", images.dims[0],
             " images but '", label_path.string(), "' holds ", labels.dims[0], " labels"));
  image_dataset out;
  out.height = out.width = 28;
  out.classes = 10;
  for (std::size_t i = 0; i < labels.values.size(); ++i)
    if (labels.values[i] >= out.classes)
      fail(errc::corrupt_data, cat("load_fashion_mnist: '", label_path.string(), "': label ", i,
                                   " = ", +labels.values[i], " is not a class 0..9"));
  const std::size_t n = images.dims[0];
  out.images = matrix<float>(n, out.height * out.width);
  const float scale = normalize ? 1.0f / (255.0f * fashion_mnist_std) : 1.0f / 255.0f;
  const float shift = normalize ? fashion_mnist_mean / fashion_mnist_std : 0.0f;
  auto pixels = out.images.flat();
  for (std::size_t i = 0; i < pixels.size(); ++i)
    pixels[i] = static_cast<float>(images.values[i]) * scale - shift;
  out.labels = labels.values;
  return out;
}

}  // namespace strata::data
