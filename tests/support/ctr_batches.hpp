// What the data-source tests share: every example of a source as one batch, bitwise batch
// equality, and a byte flipped in a file (damage a checksum must catch).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <vector>

#include "strata/data/batch.hpp"
#include "strata/data/source.hpp"

namespace strata_test {

/// Every example of `source`, in index order.
inline strata::data::ctr_batch all_examples(const strata::data::example_source& source) {
  std::vector<std::size_t> idx(source.size());
  std::iota(idx.begin(), idx.end(), std::size_t{0});
  strata::data::ctr_batch out;
  source.gather(idx, out);
  return out;
}

/// The two batches hold the same examples, bit for bit.
inline bool same_bits(const strata::data::ctr_batch& a, const strata::data::ctr_batch& b) {
  return a.size() == b.size() &&
         std::memcmp(a.dense.flat().data(), b.dense.flat().data(), a.dense.flat().size_bytes()) ==
             0 &&
         std::equal(a.keys.flat().begin(), a.keys.flat().end(), b.keys.flat().begin()) &&
         a.labels == b.labels;
}

/// Flips bit 4 of the byte at `at` of file `p`, in place.
inline void flip_byte(const std::filesystem::path& p, std::size_t at) {
  std::fstream f(p, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(static_cast<std::streamoff>(at));
  char c = 0;
  f.read(&c, 1);
  c = static_cast<char>(c ^ 0x10);
  f.seekp(static_cast<std::streamoff>(at));
  f.write(&c, 1);
}

}  // namespace strata_test
