// libFuzzer target: the IDX reader (strata/data/idx.hpp).
//
// read_idx and load_fashion_mnist only take paths, so the bytes are written to memory, never
// to disk: read_idx opens an in-memory file (memfd, /proc/self/fd/N), load_fashion_mnist a
// folder under /dev/shm.
//
// Input: one settings byte, then the file bytes.
//   bits 0-2  expected_rank = value % 5 (0-4)
//   bit  3    gzip the bytes first (so the header checks are reached through zlib too; without
//             it a gzip seed is mutated raw, which exercises zlib's error path)
//   bit  4    load_fashion_mnist instead of read_idx: a u16 n splits the bytes into the images
//             file (the first n % (size + 1)) and the labels file (the rest)
//   bit  5    load_fashion_mnist: normalize
//   bit  6    load_fashion_mnist: the test split (t10k-*) instead of train-*
// Oracles: an accepted file has expected_rank non-zero dimensions whose product is the number
// of values; an accepted dataset has 28 x 28 finite pixels per label and labels 0-9; a refusal
// is corrupt_data.
#include <zlib.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "strata/data/idx.hpp"

#include "support.hpp"

namespace {

using namespace strata;
using namespace strata::data;

/// `bytes` as a gzip stream (what gzopen/gzread read back); a 512-byte window and the least
/// memory, so each run sets up kilobytes instead of zlib's default 256 KiB.
std::vector<std::uint8_t> gzip(std::span<const std::uint8_t> bytes) {
  z_stream z{};
  if (deflateInit2(&z, Z_BEST_SPEED, Z_DEFLATED, 9 + 16, 1, Z_DEFAULT_STRATEGY) != Z_OK)
    strata_fuzz::finding("deflateInit2 failed");
  std::vector<std::uint8_t> out(deflateBound(&z, bytes.size()) + 32);
  z.next_in = const_cast<Bytef*>(bytes.data());
  z.avail_in = static_cast<uInt>(bytes.size());
  z.next_out = out.data();
  z.avail_out = static_cast<uInt>(out.size());
  if (deflate(&z, Z_FINISH) != Z_STREAM_END) strata_fuzz::finding("deflate did not finish");
  out.resize(z.total_out);
  deflateEnd(&z);
  return out;
}

void check_array(const idx_array& a, std::size_t rank) {
  strata_fuzz::require(a.dims.size() == rank, "read_idx: accepted a file of another rank");
  std::uint64_t count = 1;
  for (const std::uint32_t d : a.dims) {
    strata_fuzz::require(d != 0, "read_idx: accepted a zero dimension");
    count *= d;
  }
  strata_fuzz::require(count == a.values.size(), "read_idx: values != product of dimensions");
}

void check_dataset(const image_dataset& d) {
  strata_fuzz::require(d.height == 28 && d.width == 28 && d.classes == 10,
                       "load_fashion_mnist: not 28 x 28 x 10 classes");
  strata_fuzz::require(d.images.rows() == d.labels.size() && d.images.cols() == 784,
                       "load_fashion_mnist: images and labels disagree");
  for (const std::uint8_t label : d.labels)
    strata_fuzz::require(label < 10, "load_fashion_mnist: a label outside 0-9");
  for (const float x : d.images.flat())
    strata_fuzz::require(std::isfinite(x), "load_fashion_mnist: a pixel is not finite");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static strata_fuzz::memory_file file;
  static strata_fuzz::scratch_dir dir;
  strata_fuzz::input in(data, size);
  const unsigned settings = in.u8();
  const std::size_t rank = (settings & 7u) % 5;
  const bool compress = (settings & 8u) != 0;
  const auto prepare = [&](std::span<const std::uint8_t> bytes) {
    return compress ? gzip(bytes) : std::vector<std::uint8_t>(bytes.begin(), bytes.end());
  };
  try {
    if ((settings & 16u) == 0) {
      const auto bytes = prepare(in.rest());
      check_array(read_idx(file.write(bytes), rank), rank);
    } else {
      const std::size_t split = in.u16();
      const auto rest = in.rest();
      const std::size_t n = split % (rest.size() + 1);
      const bool test = (settings & 64u) != 0;
      const std::string prefix = test ? "t10k" : "train";
      dir.write(prefix + "-images-idx3-ubyte.gz", prepare(rest.first(n)));
      dir.write(prefix + "-labels-idx1-ubyte.gz", prepare(rest.subspan(n)));
      check_dataset(load_fashion_mnist(dir.path(), test ? mnist_split::test : mnist_split::train,
                                       (settings & 32u) != 0));
    }
    strata_fuzz::note("accepted");
  } catch (const error& e) {
    strata_fuzz::expect_code(e, {errc::corrupt_data});
  }
  return 0;
}
