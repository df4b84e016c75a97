// libFuzzer target: the Criteo TSV reader (strata/data/criteo.hpp).
//
// Input: one settings byte, then the text.
//   bits 0-1  table_rows: {1}, {2^20}, 26 sizes {1, 2, ..., 26}, {2^64 - 1}
//   bit  2    hash_seed 0 or 0x9e3779b97f4a7c15
//   bit  3    skip_bad_lines
//   bits 4-5  max_line_bytes: 40, 64, 300, 2^16
//   bits 6-7  0-2: every line through detail::parse_criteo_line (fast, no thread);
//             3: the whole criteo_reader (line splitter, parser thread, queue) over the text
//             as an in-memory file; a second byte then sets chunk_rows 1-4 (bits 0-1),
//             prefetch_chunks 1-2 (bit 2) and next()'s batch size 1-8 (bits 3-5).
// Oracles: parse_criteo_line accepts a line with 13 finite dense values >= 0, 26 keys inside
// their tables and a 0/1 label, and leaves the chunk untouched (with a reason) when it refuses;
// the reader delivers exactly the examples its summary counts, every line is counted once, and
// it fails only with corrupt_data.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

#include "strata/data/criteo.hpp"

#include "support.hpp"

namespace {

using namespace strata;
using namespace strata::data;

std::vector<std::uint64_t> rows_setting(unsigned choice) {
  switch (choice) {
    case 0:
      return {1};
    case 1:
      return {std::uint64_t{1} << 20};
    case 2: {
      std::vector<std::uint64_t> rows(criteo_sparse_columns);
      for (std::size_t f = 0; f < rows.size(); ++f)
        rows[f] = f + 1;
      return rows;
    }
    default:
      return {std::numeric_limits<std::uint64_t>::max()};
  }
}

std::uint64_t rows_of(const std::vector<std::uint64_t>& rows, std::size_t f) {
  return rows.size() == 1 ? rows[0] : rows[f];
}

/// The examples of `chunk` from `first` on have finite dense values >= 0, keys inside their
/// tables and 0/1 labels.
void check_examples(const data::detail::criteo_chunk& chunk, std::size_t first,
                    const std::vector<std::uint64_t>& rows) {
  strata_fuzz::require(chunk.dense.size() == chunk.size() * criteo_dense_columns &&
                           chunk.keys.size() == chunk.size() * criteo_sparse_columns,
                       "criteo chunk: dense/keys/labels sizes disagree");
  for (std::size_t i = first * criteo_dense_columns; i < chunk.dense.size(); ++i)
    strata_fuzz::require(std::isfinite(chunk.dense[i]) && chunk.dense[i] >= 0.0f,
                         "criteo: a dense value is negative or not finite");
  for (std::size_t i = first * criteo_sparse_columns; i < chunk.keys.size(); ++i)
    strata_fuzz::require(chunk.keys[i] < rows_of(rows, i % criteo_sparse_columns),
                         "criteo: a key is outside its table");
  for (std::size_t i = first; i < chunk.labels.size(); ++i)
    strata_fuzz::require(chunk.labels[i] == 0.0f || chunk.labels[i] == 1.0f,
                         "criteo: a label is not 0 or 1");
}

void parse_lines(std::string_view text, const criteo_options& options) {
  data::detail::criteo_chunk chunk;
  std::string why;
  while (!text.empty()) {
    const std::size_t nl = text.find('\n');
    std::string_view line = text.substr(0, nl);
    text = nl == std::string_view::npos ? std::string_view() : text.substr(nl + 1);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    const std::size_t before = chunk.size();
    const auto before_dense = chunk.dense.size(), before_keys = chunk.keys.size();
    why.clear();
    const auto bad =
        data::detail::parse_criteo_line(line, options.table_rows, options.hash_seed, chunk, why);
    if (bad) {
      strata_fuzz::require(static_cast<std::size_t>(*bad) < bad_line_kinds,
                           "criteo: unknown bad-line kind");
      strata_fuzz::require(!why.empty(), "criteo: a refused line without a reason");
      strata_fuzz::require(chunk.size() == before && chunk.dense.size() == before_dense &&
                               chunk.keys.size() == before_keys,
                           "criteo: a refused line changed the chunk");
    } else {
      strata_fuzz::require(chunk.size() == before + 1, "criteo: an accepted line added no example");
      check_examples(chunk, before, options.table_rows);
    }
  }
}

void read_file(const std::string& path, const criteo_options& options, std::size_t batch) {
  criteo_reader reader(path, options);
  ctr_batch out;
  std::size_t delivered = 0;
  for (;;) {
    const std::size_t n = reader.next(out, batch);
    if (n == 0) break;
    strata_fuzz::require(n <= batch && out.labels.size() == n, "criteo_reader: bad batch size");
    for (std::size_t i = 0; i < n; ++i) {
      strata_fuzz::require(out.labels[i] == 0.0f || out.labels[i] == 1.0f,
                           "criteo_reader: a label is not 0 or 1");
      for (std::size_t f = 0; f < criteo_sparse_columns; ++f)
        strata_fuzz::require(out.keys.row(i)[f] < rows_of(options.table_rows, f),
                             "criteo_reader: a key is outside its table");
    }
    delivered += n;
  }
  const criteo_summary s = reader.summary();
  strata_fuzz::require(s.examples == delivered, "criteo_reader: summary.examples != delivered");
  strata_fuzz::require(s.lines_read == s.examples + s.lines_skipped,
                       "criteo_reader: lines read != examples + lines skipped");
  std::size_t by_kind = 0;
  for (const std::size_t k : s.skipped_by_kind)
    by_kind += k;
  strata_fuzz::require(by_kind == s.lines_skipped, "criteo_reader: skip counts disagree");
  strata_fuzz::require(options.skip_bad_lines || s.lines_skipped == 0,
                       "criteo_reader: a line was skipped without skip_bad_lines");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static strata_fuzz::memory_file file;
  strata_fuzz::input in(data, size);
  const unsigned settings = in.u8();
  criteo_options options;
  options.table_rows = rows_setting(settings & 3u);
  options.hash_seed = (settings & 4u) != 0 ? 0x9e3779b97f4a7c15ull : 0;
  options.skip_bad_lines = (settings & 8u) != 0;
  constexpr std::size_t line_limits[] = {40, 64, 300, std::size_t{1} << 16};
  options.max_line_bytes = line_limits[(settings >> 4) & 3u];
  const bool whole_reader = (settings >> 6) == 3;
  const unsigned reader_settings = whole_reader ? in.u8() : 0;
  const auto text = in.rest();
  try {
    if (!whole_reader) {
      parse_lines({reinterpret_cast<const char*>(text.data()), text.size()}, options);
    } else {
      options.chunk_rows = 1 + (reader_settings & 3u);
      options.prefetch_chunks = 1 + ((reader_settings >> 2) & 1u);
      read_file(file.write(text), options, 1 + ((reader_settings >> 3) & 7u));
    }
    strata_fuzz::note("accepted");
  } catch (const error& e) {
    strata_fuzz::expect_code(e, {errc::corrupt_data});
  }
  return 0;
}
