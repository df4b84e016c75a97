// libFuzzer target: the frequency-threshold vocabulary reader (strata/data/ctr_vocabulary.hpp),
// which reads `vocabulary.ctrv` beside converted data and inside serving bundles.
//
// The reader only takes a path, so the bytes go to an in-memory file (memfd, /proc/self/fd/N).
//
// Input: one settings byte, then the file bytes.
//   bit  0    append the right checksum (fast_checksum) to the bytes: a random file almost
//             never carries one, so without this the fuzzer would rarely get past it
// Oracles: an accepted vocabulary has 1 or more tables; each table's frequent keys ascend
// inside its hashed rows and map to their own rank; a key past the last frequent one of a
// table maps to its rare row (= rows − 1); saving it and loading it back keeps its fingerprint;
// it never asks for much more memory than its file holds (libFuzzer's malloc limit). A refusal
// is corrupt_data (or unsupported for another version).
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "strata/core/checksum.hpp"
#include "strata/data/ctr_vocabulary.hpp"

#include "support.hpp"

namespace {

using namespace strata;
using namespace strata::data;

void check(const ctr_vocabulary& v, const strata_fuzz::scratch_dir& dir) {
  strata_fuzz::require(v.tables() >= 1, "ctr_vocabulary: accepted a file without tables");
  for (std::size_t f = 0; f < v.tables(); ++f) {
    const auto keys = v.frequent_keys(f);
    strata_fuzz::require(v.rows(f) == keys.size() + 1 && v.rare_row(f) == keys.size(),
                         "ctr_vocabulary: rows are not the frequent keys + the rare row");
    for (std::size_t i = 0; i < keys.size(); ++i) {
      strata_fuzz::require(keys[i] < v.hash_rows(f) && (i == 0 || keys[i - 1] < keys[i]),
                           "ctr_vocabulary: frequent keys not ascending inside the table");
      strata_fuzz::require(v.map(f, keys[i]) == i, "ctr_vocabulary: a key maps to another row");
    }
    const std::uint64_t past = keys.empty() ? 0 : keys.back() + 1;
    if (past < v.hash_rows(f))
      strata_fuzz::require(v.map(f, past) == v.rare_row(f),
                           "ctr_vocabulary: a key that is not frequent has a row of its own");
  }
  const auto path = dir.path() / "roundtrip.ctrv";
  v.save(path);
  strata_fuzz::require(ctr_vocabulary::load(path).fingerprint() == v.fingerprint(),
                       "ctr_vocabulary: save + load changed the vocabulary");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static strata_fuzz::memory_file file;
  static strata_fuzz::scratch_dir dir;
  strata_fuzz::input in(data, size);
  const unsigned settings = in.u8();
  const auto rest = in.rest();
  std::vector<std::uint8_t> bytes(rest.begin(), rest.end());
  if ((settings & 1u) != 0) {
    const std::uint64_t sum = fast_checksum(std::as_bytes(std::span(bytes)));
    const auto* p = reinterpret_cast<const std::uint8_t*>(&sum);
    bytes.insert(bytes.end(), p, p + 8);
  }
  try {
    check(ctr_vocabulary::load(file.write(bytes)), dir);
    strata_fuzz::note("accepted");
  } catch (const error& e) {
    strata_fuzz::expect_code(e, {errc::corrupt_data, errc::unsupported});
  }
  return 0;
}
