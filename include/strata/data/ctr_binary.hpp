/// @file ctr_binary.hpp
/// Converted CTR training data: a chunked, columnar binary file per day (`.ctrb`), written once
/// from Criteo TSV (`convert_criteo`, parsing in parallel) and read by memory mapping
/// (`ctr_files`, an `example_source` whose loaders shuffle within a bounded window, so resident
/// memory stays bounded whatever the data size).
///
/// ```cpp
/// strata::data::convert_criteo("day_0.tsv", "data/day_0.ctrb", {.table_rows = {1u << 20}});
/// strata::data::ctr_files days("data");          // every .ctrb file of the folder, in day order
/// trainer.fit(days);                             // rank r reads only its shards' chunks
/// ```
///
/// File layout (little-endian):
/// - header, 4096 bytes: magic "STRATACB", version, examples, dense/sparse columns, chunk rows,
///   key width (4 or 8 bytes), hash seed, chunk count, chunk table offset, source bytes/lines,
///   lines skipped, table_rows[sparse columns] (the hashing: keys of feature f lie in
///   [0, table_rows[f]), `criteo_key(f, value, table_rows[f], hash_seed)`), and at its end the
///   checksum of the bytes before it;
/// - chunks, each starting on a 4096-byte boundary: labels (1 byte each), dense values (float32,
///   example-major), keys (uint32 or uint64, example-major), each part padded to 8 bytes;
/// - the chunk table: (offset, rows, checksum) per chunk, then its own checksum.
/// A file is written under a temporary name and renamed when complete: a file with the final
/// name is whole. A folder may also hold a frequency-threshold vocabulary (`vocabulary.ctrv`,
/// ctr_vocabulary.hpp, `build_ctr_vocabulary`) that its files' keys are read through.
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <deque>
#include <exception>
#include <filesystem>
#include <fstream>
#include <memory>
#include <mutex>
#include <numeric>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include <oneapi/tbb/info.h>
#include <oneapi/tbb/parallel_for.h>
#include <oneapi/tbb/parallel_pipeline.h>

#include "strata/core/checksum.hpp"
#include "strata/core/error.hpp"
#include "strata/core/mapped_file.hpp"
#include "strata/core/rng.hpp"
#include "strata/core/timer.hpp"
#include "strata/data/batch.hpp"
#include "strata/data/criteo.hpp"
#include "strata/data/ctr_vocabulary.hpp"
#include "strata/data/source.hpp"

namespace strata::data {

/// File name extension of converted files.
inline constexpr std::string_view ctr_binary_extension = ".ctrb";

/// What a converted file holds, as its header records it.
struct ctr_file_schema {
  std::size_t dense_cols = criteo_dense_columns;
  std::size_t sparse_cols = criteo_sparse_columns;
  std::vector<std::uint64_t> table_rows;  ///< one per sparse column
  std::uint64_t hash_seed = 0;
  std::size_t chunk_rows = 4096;
  /// 4 when every table has at most 2^32 rows, else 8.
  [[nodiscard]] std::size_t key_bytes() const noexcept {
    for (const auto rows : table_rows)
      if (rows > (std::uint64_t{1} << 32)) return 8;
    return 4;
  }
  /// Bytes of one example in a chunk (padding aside).
  [[nodiscard]] std::size_t example_bytes() const noexcept {
    return 1 + 4 * dense_cols + key_bytes() * sparse_cols;
  }
  friend bool operator==(const ctr_file_schema&, const ctr_file_schema&) = default;
};

namespace detail {

inline constexpr std::array<char, 8> ctrb_magic = {'S', 'T', 'R', 'A', 'T', 'A', 'C', 'B'};
inline constexpr std::uint32_t ctrb_version = 1;
inline constexpr std::size_t ctrb_header_bytes = 4096;
inline constexpr std::size_t ctrb_alignment = 4096;
inline constexpr std::size_t ctrb_max_sparse = 256;  // table_rows must fit in the header

[[nodiscard]] constexpr std::size_t round_up(std::size_t n, std::size_t to) noexcept {
  return (n + to - 1) / to * to;
}

/// Byte offsets of a chunk's parts (relative to the chunk's start).
struct chunk_parts {
  std::size_t dense = 0, keys = 0, bytes = 0;
  chunk_parts(std::size_t rows, const ctr_file_schema& s) noexcept
      : dense(round_up(rows, 8)),
        keys(dense + round_up(rows * s.dense_cols * 4, 8)),
        bytes(keys + rows * s.sparse_cols * s.key_bytes()) {}
};

/// One chunk as the file's table lists it.
struct chunk_record {
  std::uint64_t offset = 0, rows = 0, checksum = 0;
};

}  // namespace detail

/// Writes one `.ctrb` file: examples appended in order are cut into chunks of
/// `schema.chunk_rows`; `finish()` writes the chunk table and header and renames the file into
/// place. Destroyed without `finish()`, it removes its temporary file. Not thread-safe.
class ctr_binary_writer {
 public:
  ctr_binary_writer(std::filesystem::path path, ctr_file_schema schema)
      : path_(std::move(path)), schema_(std::move(schema)) {
    STRATA_EXPECTS(schema_.chunk_rows > 0 && schema_.chunk_rows <= (std::size_t{1} << 24),
                   "ctr_binary_writer: chunk_rows ", schema_.chunk_rows, " must be in [1, 2^24]");
    STRATA_EXPECTS(schema_.sparse_cols > 0 && schema_.sparse_cols <= detail::ctrb_max_sparse,
                   "ctr_binary_writer: ", schema_.sparse_cols, " sparse columns; 1 to ",
                   detail::ctrb_max_sparse, " fit the header");
    STRATA_EXPECTS(schema_.dense_cols <= (std::size_t{1} << 16),
                   "ctr_binary_writer: ", schema_.dense_cols, " dense columns is too many");
    if (schema_.table_rows.size() == 1)
      schema_.table_rows.assign(schema_.sparse_cols, schema_.table_rows[0]);
    STRATA_EXPECTS(schema_.table_rows.size() == schema_.sparse_cols,
                   "ctr_binary_writer: table_rows holds ", schema_.table_rows.size(), " sizes for ",
                   schema_.sparse_cols, " sparse columns (give 1 or one each)");
    for (std::size_t f = 0; f < schema_.table_rows.size(); ++f)
      STRATA_EXPECTS(schema_.table_rows[f] > 0, "ctr_binary_writer: table_rows[", f, "] is 0");
    temp_ = path_;
    temp_ += ".partial";
    out_.open(temp_, std::ios::binary | std::ios::trunc);
    if (!out_)
      fail(errc::io_error, cat("cannot create '", temp_.string(), "': ", std::strerror(errno),
                               "; check that the folder exists and is writable"));
    const std::vector<std::byte> zeros(detail::ctrb_header_bytes);
    write(zeros);  // the header, rewritten by finish()
    labels_.reserve(schema_.chunk_rows);
    dense_.reserve(schema_.chunk_rows * schema_.dense_cols);
    keys_.reserve(schema_.chunk_rows * schema_.sparse_cols);
  }
  ctr_binary_writer(const ctr_binary_writer&) = delete;
  ctr_binary_writer& operator=(const ctr_binary_writer&) = delete;
  ~ctr_binary_writer() {
    if (!finished_) {
      out_.close();
      std::error_code ignored;
      std::filesystem::remove(temp_, ignored);
    }
  }

  /// Appends `labels.size()` examples: row-major `dense` (labels × dense_cols) and `keys`
  /// (labels × sparse_cols; key of column f below table_rows[f]).
  void append(std::span<const float> dense, std::span<const std::uint64_t> keys,
              std::span<const float> labels) {
    const std::size_t n = labels.size();
    STRATA_EXPECTS(dense.size() == n * schema_.dense_cols && keys.size() == n * schema_.sparse_cols,
                   "ctr_binary_writer::append: ", n, " labels need ", n * schema_.dense_cols,
                   " dense values and ", n * schema_.sparse_cols, " keys; got ", dense.size(),
                   " and ", keys.size());
    for (std::size_t i = 0; i < n; ++i) {
      const float label = labels[i];
      STRATA_EXPECTS(label == 0.0f || label == 1.0f, "ctr_binary_writer::append: label ", label,
                     " of example ", examples_ + labels_.size(), " is not 0 or 1");
      for (std::size_t f = 0; f < schema_.sparse_cols; ++f) {
        const std::uint64_t key = keys[i * schema_.sparse_cols + f];
        if (key >= schema_.table_rows[f])
          fail(errc::out_of_range,
               cat("ctr_binary_writer::append: key ", key, " of column ", f, " (example ",
                   examples_ + labels_.size(), ") is outside its table of ", schema_.table_rows[f],
                   " rows; hash with the same table_rows"));
      }
      labels_.push_back(static_cast<std::uint8_t>(label));
      dense_.insert(dense_.end(),
                    dense.begin() + static_cast<std::ptrdiff_t>(i * schema_.dense_cols),
                    dense.begin() + static_cast<std::ptrdiff_t>((i + 1) * schema_.dense_cols));
      keys_.insert(keys_.end(), keys.begin() + static_cast<std::ptrdiff_t>(i * schema_.sparse_cols),
                   keys.begin() + static_cast<std::ptrdiff_t>((i + 1) * schema_.sparse_cols));
      if (labels_.size() == schema_.chunk_rows) flush_chunk();
    }
  }
  void append(const ctr_batch& batch) {
    append(batch.dense.flat(), batch.keys.flat(), batch.labels);
  }

  /// Records where the examples came from (shown by `ctr_files::describe`).
  void set_source(std::uint64_t bytes, std::uint64_t lines, std::uint64_t skipped) noexcept {
    source_bytes_ = bytes;
    source_lines_ = lines;
    lines_skipped_ = skipped;
  }

  /// Completes the file: last chunk, chunk table, header; renames it into place. Returns the
  /// file's size in bytes.
  std::uint64_t finish() {
    STRATA_EXPECTS(!finished_, "ctr_binary_writer::finish: already finished");
    if (!labels_.empty()) flush_chunk();
    // The chunk table.
    const std::uint64_t table_offset = offset_;
    std::vector<std::byte> table;
    detail::field_writer tw{table};
    for (const auto& c : chunks_) {
      tw.put(c.offset);
      tw.put(c.rows);
      tw.put(c.checksum);
    }
    tw.put(fast_checksum(table));
    write(table);
    // The header.
    std::vector<std::byte> header;
    detail::field_writer hw{header};
    for (const char c : detail::ctrb_magic)
      hw.put(c);
    hw.put(detail::ctrb_version);
    hw.put(static_cast<std::uint32_t>(detail::ctrb_header_bytes));
    hw.put(static_cast<std::uint64_t>(examples_));
    hw.put(static_cast<std::uint32_t>(schema_.dense_cols));
    hw.put(static_cast<std::uint32_t>(schema_.sparse_cols));
    hw.put(static_cast<std::uint32_t>(schema_.chunk_rows));
    hw.put(static_cast<std::uint32_t>(schema_.key_bytes()));
    hw.put(schema_.hash_seed);
    hw.put(static_cast<std::uint64_t>(chunks_.size()));
    hw.put(table_offset);
    hw.put(source_bytes_);
    hw.put(source_lines_);
    hw.put(lines_skipped_);
    for (const auto rows : schema_.table_rows)
      hw.put(rows);
    header.resize(detail::ctrb_header_bytes - sizeof(std::uint64_t));
    hw.put(fast_checksum(header));
    out_.seekp(0);
    write(header);
    out_.flush();
    if (!out_)
      fail(errc::io_error, cat("writing '", temp_.string(),
                               "' failed (disk full?); free space "
                               "and convert again"));
    out_.close();
    std::filesystem::rename(temp_, path_);
    finished_ = true;
    return table_offset + table.size();
  }

  [[nodiscard]] std::size_t examples() const noexcept { return examples_ + labels_.size(); }
  [[nodiscard]] const ctr_file_schema& schema() const noexcept { return schema_; }

 private:
  void write(std::span<const std::byte> bytes) {
    out_.write(reinterpret_cast<const char*>(bytes.data()),
               static_cast<std::streamsize>(bytes.size()));
    if (!out_)
      fail(errc::io_error, cat("writing '", temp_.string(),
                               "' failed (disk full?); free space "
                               "and convert again"));
  }
  void flush_chunk() {
    const std::size_t rows = labels_.size();
    const detail::chunk_parts parts(rows, schema_);
    chunk_.assign(parts.bytes, std::byte{0});
    std::memcpy(chunk_.data(), labels_.data(), rows);
    std::memcpy(chunk_.data() + parts.dense, dense_.data(), dense_.size() * sizeof(float));
    if (schema_.key_bytes() == 8) {
      std::memcpy(chunk_.data() + parts.keys, keys_.data(), keys_.size() * 8);
    } else {
      for (std::size_t i = 0; i < keys_.size(); ++i) {
        const auto k = static_cast<std::uint32_t>(keys_[i]);
        std::memcpy(chunk_.data() + parts.keys + 4 * i, &k, 4);
      }
    }
    chunks_.push_back({offset_, rows, fast_checksum(chunk_)});
    write(chunk_);
    offset_ += parts.bytes;
    const std::size_t padded = detail::round_up(offset_, detail::ctrb_alignment);
    if (padded > offset_) {
      const std::vector<std::byte> pad(padded - offset_);
      write(pad);
      offset_ = padded;
    }
    examples_ += rows;
    labels_.clear();
    dense_.clear();
    keys_.clear();
  }

  std::filesystem::path path_, temp_;
  ctr_file_schema schema_;
  std::ofstream out_;
  std::uint64_t offset_ = detail::ctrb_header_bytes;
  std::size_t examples_ = 0;
  std::uint64_t source_bytes_ = 0, source_lines_ = 0, lines_skipped_ = 0;
  std::vector<detail::chunk_record> chunks_;
  std::vector<std::uint8_t> labels_;
  std::vector<float> dense_;
  std::vector<std::uint64_t> keys_;
  std::vector<std::byte> chunk_;
  bool finished_ = false;
};

/// How `convert_criteo` works.
struct convert_options {
  std::size_t chunk_rows = 4096;  ///< examples per chunk (the shuffle's unit)
  /// TSV bytes parsed as one task (the pipeline holds about 2 × threads of them).
  std::size_t block_bytes = std::size_t{4} << 20;
  std::size_t threads = 0;  ///< parser tasks in flight (0: oneTBB's default concurrency)
};

/// What a conversion did.
struct conversion_report {
  criteo_summary summary;          ///< lines, examples, skipped lines and why
  std::uint64_t tsv_bytes = 0;     ///< size of the TSV read
  std::uint64_t output_bytes = 0;  ///< size of the file written
  double seconds = 0;
  [[nodiscard]] double tsv_mb_per_second() const noexcept {
    return seconds > 0 ? static_cast<double>(tsv_bytes) / 1e6 / seconds : 0.0;
  }
};

namespace detail {

/// A run of whole TSV lines (or one overlong line, reported as such).
struct text_block {
  std::string text;
  bool overlong = false;  // stands for one line longer than max_line_bytes
};

/// A block's parsed examples, its line count and its first bad lines (local line index).
struct parsed_block {
  criteo_chunk rows;
  std::size_t lines = 0;
  struct bad {
    std::size_t line;  // 0-based within the block
    bad_line_kind kind;
    std::string why;
  };
  std::vector<bad> bad_lines;  // all of them (kinds are counted); reasons kept for the first few
};

/// Reads a file in blocks that end at a newline, through one buffer allocated once (never
/// cleared: a block's text is copied out of it once).
class block_reader {
 public:
  block_reader(const std::filesystem::path& path, std::size_t block_bytes, std::size_t max_line)
      : path_(path),
        block_(std::max(block_bytes, 2 * max_line + 2)),
        max_line_(max_line),
        buffer_(std::make_unique_for_overwrite<char[]>(block_ + max_line + 2)),
        capacity_(block_ + max_line + 2) {
    file_.reset(std::fopen(path.c_str(), "rb"));
    if (!file_)
      fail(errc::io_error, cat("convert_criteo: cannot open '", path.string(),
                               "': ", std::strerror(errno), "; check the path and permissions"));
  }
  /// The next block; false at the end of the file.
  bool next(text_block& out) {
    out.overlong = false;
    out.text.clear();
    for (;;) {
      if (end_ - begin_ < block_ && !eof_) fill();
      const std::string_view held(buffer_.get() + begin_, end_ - begin_);
      if (held.empty()) {
        if (!skipping_) return false;
        skipping_ = false;  // the file ended inside an overlong line
        out.overlong = true;
        return true;
      }
      if (skipping_) {  // inside an overlong line: drop up to its newline
        const auto nl = held.find('\n');
        if (nl == std::string_view::npos) {
          begin_ = end_;
          if (eof_) {
            skipping_ = false;
            out.overlong = true;
            return true;
          }
          continue;
        }
        begin_ += nl + 1;
        skipping_ = false;
        out.overlong = true;
        return true;
      }
      const auto last = held.rfind('\n');
      if (last != std::string_view::npos) {
        // Whole lines up to the last newline; the rest waits for more bytes.
        out.text.assign(held.data(), last + 1);
        begin_ += last + 1;
        return true;
      }
      if (eof_) {  // the last line, without its newline
        out.text.assign(held);
        begin_ = end_;
        return true;
      }
      if (held.size() > max_line_ + 1) skipping_ = true;  // no newline within the limit
    }
  }
  [[nodiscard]] std::uint64_t bytes_read() const noexcept { return bytes_; }

 private:
  struct closer {
    void operator()(std::FILE* f) const noexcept { std::fclose(f); }
  };
  void fill() {
    if (begin_ > 0) {  // keep the partial line at the front
      std::memmove(buffer_.get(), buffer_.get() + begin_, end_ - begin_);
      end_ -= begin_;
      begin_ = 0;
    }
    const std::size_t got = std::fread(buffer_.get() + end_, 1, capacity_ - end_, file_.get());
    end_ += got;
    bytes_ += got;
    if (got == 0) {
      if (std::ferror(file_.get()))
        fail(errc::io_error,
             cat("convert_criteo: read error in '", path_.string(), "': ", std::strerror(errno)));
      eof_ = true;
    }
  }
  std::filesystem::path path_;
  std::unique_ptr<std::FILE, closer> file_;
  std::size_t block_, max_line_;
  std::unique_ptr<char[]> buffer_;
  std::size_t capacity_, begin_ = 0, end_ = 0;
  bool eof_ = false, skipping_ = false;
  std::uint64_t bytes_ = 0;
};

inline void parse_lines(std::string_view text, const criteo_options& options,
                        const criteo_hashing& hashing, parsed_block& out);

inline void parse_block(const text_block& block, const criteo_options& options,
                        const criteo_hashing& hashing, parsed_block& out) {
  out.rows.dense.clear();
  out.rows.keys.clear();
  out.rows.labels.clear();
  out.bad_lines.clear();
  out.lines = 0;
  if (block.overlong) {
    out.lines = 1;
    out.bad_lines.push_back({0, bad_line_kind::overlong,
                             cat("line is longer than max_line_bytes = ", options.max_line_bytes)});
    return;
  }
  parse_lines(block.text, options, hashing, out);
}

/// Parses whole lines of `text` (each ending at a newline, the last one possibly without) as
/// parse_block does, appending to `out` (cleared by the caller).
inline void parse_lines(std::string_view text, const criteo_options& options,
                        const criteo_hashing& hashing, parsed_block& out) {
  std::string why;
  while (!text.empty()) {
    const auto nl = text.find('\n');
    std::string_view line = text.substr(0, nl);
    text.remove_prefix(nl == std::string_view::npos ? text.size() : nl + 1);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    const std::size_t index = out.lines++;
    if (line.size() > options.max_line_bytes) {
      out.bad_lines.push_back(
          {index, bad_line_kind::overlong,
           cat("line is longer than max_line_bytes = ", options.max_line_bytes)});
      continue;
    }
    if (const auto bad = parse_criteo_line(line, hashing, out.rows, why))
      out.bad_lines.push_back({index, *bad, why});
  }
}

}  // namespace detail

/// Converts a Criteo TSV file into a `.ctrb` file at `output`, hashing exactly as
/// `criteo_reader` with the same `options` does (same keys, same dense transform, same
/// bad-line rules and messages "file:line: what"). Parsing runs as oneTBB pipeline tasks over
/// blocks of whole lines; the file is written in order. Memory: O(threads × block_bytes).
inline conversion_report convert_criteo(const std::filesystem::path& tsv,
                                        const std::filesystem::path& output,
                                        criteo_options options = {},
                                        const convert_options& how = {}) {
  STRATA_EXPECTS(
      options.table_rows.size() == 1 || options.table_rows.size() == criteo_sparse_columns,
      "convert_criteo: table_rows must hold 1 or 26 sizes, not ", options.table_rows.size());
  STRATA_EXPECTS(how.block_bytes > 0, "convert_criteo: block_bytes must be positive");
  ctr_file_schema schema;
  schema.table_rows = options.table_rows;
  schema.hash_seed = options.hash_seed;
  schema.chunk_rows = how.chunk_rows;
  ctr_binary_writer writer(output, schema);  // checks the schema
  const criteo_hashing hashing(options.table_rows, options.hash_seed);
  const stopwatch clock;
  detail::block_reader reader(tsv, how.block_bytes, options.max_line_bytes);
  conversion_report report;
  criteo_summary& summary = report.summary;
  const std::size_t tokens =
      2 * (how.threads != 0 ? how.threads
                            : static_cast<std::size_t>(oneapi::tbb::info::default_concurrency())) +
      1;
  // Appends one parsed block in file order; a bad line stops the conversion (no file is
  // left) unless skipped.
  const auto write_block = [&](const detail::parsed_block& parsed) {
    std::size_t row = 0;
    std::size_t next_bad = 0;
    for (std::size_t line = 0; line < parsed.lines; ++line) {
      if (next_bad < parsed.bad_lines.size() && parsed.bad_lines[next_bad].line == line) {
        const auto& bad = parsed.bad_lines[next_bad++];
        const std::string where = cat(tsv.string(), ":", summary.lines_read + line + 1, ": ");
        if (!options.skip_bad_lines)
          fail(errc::corrupt_data, cat(where, bad.why, " (", to_string(bad.kind),
                                       "); fix the file or convert with skip_bad_lines = true"));
        ++summary.lines_skipped;
        ++summary.skipped_by_kind[static_cast<std::size_t>(bad.kind)];
        if (summary.first_reasons.size() < options.max_reasons)
          summary.first_reasons.push_back(where + bad.why);
        continue;
      }
      ++row;
    }
    writer.append(parsed.rows.dense, parsed.rows.keys, parsed.rows.labels);
    summary.lines_read += parsed.lines;
    summary.examples += row;
  };
  // No exception may leave a filter: oneTBB drops the tokens in flight when a pipeline is
  // cancelled by one (their blocks leak). The first failure is kept, the input stops, the
  // stages after it pass their blocks through untouched, and it is raised after the pipeline.
  std::exception_ptr failure;
  std::atomic<bool> failed{false};
  const auto keep_failure = [&] {
    if (!failed.exchange(true)) failure = std::current_exception();
  };
  oneapi::tbb::parallel_pipeline(
      tokens, oneapi::tbb::make_filter<void, std::shared_ptr<detail::text_block>>(
                  oneapi::tbb::filter_mode::serial_in_order,
                  [&](oneapi::tbb::flow_control& fc) -> std::shared_ptr<detail::text_block> {
                    try {
                      auto block = std::make_shared<detail::text_block>();
                      if (!failed.load() && reader.next(*block)) return block;
                    } catch (...) {
                      keep_failure();
                    }
                    fc.stop();
                    return nullptr;
                  }) &
                  oneapi::tbb::make_filter<std::shared_ptr<detail::text_block>,
                                           std::shared_ptr<detail::parsed_block>>(
                      oneapi::tbb::filter_mode::parallel,
                      [&](const std::shared_ptr<detail::text_block>& block)
                          -> std::shared_ptr<detail::parsed_block> {
                        if (failed.load()) return nullptr;
                        try {
                          auto parsed = std::make_shared<detail::parsed_block>();
                          detail::parse_block(*block, options, hashing, *parsed);
                          return parsed;
                        } catch (...) {
                          keep_failure();
                          return nullptr;
                        }
                      }) &
                  oneapi::tbb::make_filter<std::shared_ptr<detail::parsed_block>, void>(
                      oneapi::tbb::filter_mode::serial_in_order,
                      [&](const std::shared_ptr<detail::parsed_block>& parsed) {
                        if (!parsed || failed.load()) return;
                        try {
                          write_block(*parsed);
                        } catch (...) {
                          keep_failure();
                        }
                      }));
  if (failure) std::rethrow_exception(failure);
  report.tsv_bytes = reader.bytes_read();
  writer.set_source(report.tsv_bytes, summary.lines_read, summary.lines_skipped);
  report.output_bytes = writer.finish();
  report.seconds = clock.seconds();
  return report;
}

/// The `.ctrb` files a path names: the file itself, or every `.ctrb` file of a folder in
/// natural order (day_2 before day_10). A folder without one raises `errc::invalid_argument`.
inline std::vector<std::filesystem::path> ctr_binary_files(const std::filesystem::path& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::exists(path, ec))
    fail(errc::io_error, cat("'", path.string(),
                             "' does not exist; give a converted .ctrb file "
                             "or a folder of them (strata_convert writes them)"));
  if (!fs::is_directory(path, ec)) return {path};
  std::vector<fs::path> files;
  for (const auto& entry : fs::directory_iterator(path))
    if (entry.is_regular_file() && entry.path().extension() == ctr_binary_extension)
      files.push_back(entry.path());
  if (files.empty())
    fail(errc::invalid_argument,
         cat("the folder '", path.string(), "' holds no ", ctr_binary_extension,
             " file; convert TSV days into it first (strata_convert)"));
  // Natural order: runs of digits compare as numbers.
  const auto natural_less = [](const fs::path& a, const fs::path& b) {
    const std::string x = a.filename().string(), y = b.filename().string();
    std::size_t i = 0, j = 0;
    while (i < x.size() && j < y.size()) {
      const bool dx = x[i] >= '0' && x[i] <= '9', dy = y[j] >= '0' && y[j] <= '9';
      if (dx && dy) {
        std::size_t ei = i, ej = j;
        while (ei < x.size() && x[ei] >= '0' && x[ei] <= '9')
          ++ei;
        while (ej < y.size() && y[ej] >= '0' && y[ej] <= '9')
          ++ej;
        const std::string_view nx = std::string_view(x).substr(i, ei - i),
                               ny = std::string_view(y).substr(j, ej - j);
        const auto strip = [](std::string_view s) {
          while (s.size() > 1 && s.front() == '0')
            s.remove_prefix(1);
          return s;
        };
        const auto sx = strip(nx), sy = strip(ny);
        if (sx.size() != sy.size()) return sx.size() < sy.size();
        if (sx != sy) return sx < sy;
        i = ei;
        j = ej;
        continue;
      }
      if (x[i] != y[j]) return x[i] < y[j];
      ++i;
      ++j;
    }
    return x.size() - i < y.size() - j;
  };
  std::sort(files.begin(), files.end(), natural_less);
  return files;
}

/// Criteo TSV files for `ctr_files` to stream (index once, parse chunk by chunk while training)
/// instead of converting them.
struct tsv_input {
  std::vector<std::filesystem::path> files;
  /// Hashing and bad-line rules, as `load_criteo` takes them (`chunk_rows`, `prefetch_chunks`
  /// of it aside: see chunk_lines).
  criteo_options options{};
  /// Lines per chunk: the unit of the per-epoch shuffle and of the data shards (a chunk holds
  /// its good lines: fewer when some are skipped).
  std::size_t chunk_lines = 4096;
};

/// Converted files read by memory mapping, as one `example_source` (examples of the files in
/// order). Opening checks every header and chunk table (a damaged or truncated file raises
/// `errc::corrupt_data` naming it); each chunk's checksum is checked when a loader's window
/// takes it in, and by `verify()`. Training loaders (`loader`) deal each epoch's chunks into
/// `data_shards` shards in a shuffled order (keyed by seed and epoch), shuffle examples within
/// windows of consecutive chunks, and drop a window's pages once past it: resident memory is
/// about two windows per shard a rank reads, whatever the files' size. When the files' folder
/// holds a vocabulary (`vocabulary.ctrv`, ctr_vocabulary.hpp), every key is read through it:
/// keys then lie in [0, table_rows()[f]) rather than the hashed rows of `schema()`.
///
/// Criteo TSV files (`tsv_input`) are streamed the same way without a conversion: opening maps
/// each file, cuts it into chunks of `chunk_lines` lines (a parallel newline scan) and parses
/// every chunk once in parallel to count its good lines (a bad line stops there, naming
/// file:line, unless skipped); a loader parses each window's chunks when it takes the window in
/// (in parallel) and drops them with it, so resident memory is about two windows of parsed
/// examples (≈ 270 B each) per shard. A TSV chunk of L lines and a `.ctrb` chunk of L examples
/// deal alike: a day streamed and the same day converted with `--chunk-rows L` give the same
/// batches. Const members are safe from many threads at once.
class ctr_files final : public example_source {
 public:
  /// Default examples shuffled together (about 40 MiB of Criteo examples).
  static constexpr std::size_t default_shuffle_window = std::size_t{1} << 18;

  explicit ctr_files(const std::filesystem::path& path) : ctr_files(ctr_binary_files(path)) {}
  explicit ctr_files(const std::vector<std::filesystem::path>& files) {
    STRATA_EXPECTS(!files.empty(), "ctr_files: no file given");
    for (const auto& p : files)
      open(p);
    adopt_vocabulary(files);
  }
  /// Streams TSV files (see the class comment): raises what load_criteo raises for the same
  /// files and options (`errc::corrupt_data` "file:line: what" for a bad line unless skipped,
  /// `errc::io_error` for a missing file).
  explicit ctr_files(const tsv_input& input) {
    STRATA_EXPECTS(!input.files.empty(), "ctr_files: no TSV file given");
    STRATA_EXPECTS(input.chunk_lines > 0 && input.chunk_lines <= (std::size_t{1} << 24),
                   "ctr_files: chunk_lines ", input.chunk_lines, " must be in [1, 2^24]");
    const auto& rows = input.options.table_rows;
    STRATA_EXPECTS(rows.size() == 1 || rows.size() == criteo_sparse_columns,
                   "ctr_files: table_rows must hold 1 or 26 sizes, not ", rows.size());
    for (std::size_t f = 0; f < rows.size(); ++f)
      STRATA_EXPECTS(rows[f] > 0, "ctr_files: table_rows[", f, "] is 0; every table needs a row");
    STRATA_EXPECTS(input.options.max_line_bytes >= 40, "ctr_files: max_line_bytes ",
                   input.options.max_line_bytes, " cannot hold a 40-field line");
    tsv_ = std::make_shared<tsv_state>(input.options);
    schema_.table_rows =
        rows.size() == 1 ? std::vector<std::uint64_t>(criteo_sparse_columns, rows[0]) : rows;
    schema_.hash_seed = input.options.hash_seed;
    schema_.chunk_rows = input.chunk_lines;
    for (const auto& p : input.files)
      open_tsv(p, input.chunk_lines);
    rows_ = schema_.table_rows;
    key_bytes_ = schema_.key_bytes();
  }
  /// Streamed TSV: what opening found (lines, examples, lines skipped and why); empty for
  /// converted files.
  [[nodiscard]] const criteo_summary& tsv_summary() const noexcept {
    static const criteo_summary none;
    return tsv_ ? tsv_->summary : none;
  }
  /// Whether the files are streamed TSV.
  [[nodiscard]] bool streamed_tsv() const noexcept { return tsv_ != nullptr; }

  [[nodiscard]] std::size_t size() const noexcept override { return examples_; }
  [[nodiscard]] std::size_t dense_cols() const noexcept override { return schema_.dense_cols; }
  [[nodiscard]] std::size_t sparse_cols() const noexcept override { return schema_.sparse_cols; }
  /// The files' common schema (hashing spec included): the keys as stored.
  [[nodiscard]] const ctr_file_schema& schema() const noexcept { return schema_; }
  /// Rows of each table as read: the vocabulary's (frequent keys + 1) when the folder has one,
  /// else the hashed rows of `schema()`.
  [[nodiscard]] const std::vector<std::uint64_t>& table_rows() const noexcept { return rows_; }
  /// The vocabulary keys are read through, or nullptr.
  [[nodiscard]] const ctr_vocabulary* vocabulary() const noexcept { return vocabulary_.get(); }
  /// The file the vocabulary was read from (empty without one).
  [[nodiscard]] const std::filesystem::path& vocabulary_file() const noexcept {
    return vocabulary_file_;
  }
  /// The files, in the order their examples are numbered.
  [[nodiscard]] std::vector<std::filesystem::path> paths() const {
    std::vector<std::filesystem::path> p;
    for (const auto& f : files_)
      p.push_back(f.path);
    return p;
  }
  [[nodiscard]] std::size_t files() const noexcept { return files_.size(); }
  [[nodiscard]] std::size_t chunks() const noexcept { return chunks_.size(); }
  /// Total bytes of the files.
  [[nodiscard]] std::uint64_t bytes() const noexcept {
    std::uint64_t n = 0;
    for (const auto& f : files_)
      n += f.bytes;
    return n;
  }
  /// One line: files, examples, chunks, bytes, hashing (and the vocabulary).
  [[nodiscard]] std::string describe() const {
    const auto [low, high] = std::minmax_element(rows_.begin(), rows_.end());
    if (tsv_)
      return cat(files_.size(), " TSV file(s) streamed, ", examples_, " examples in ",
                 chunks_.size(), " chunks of up to ", schema_.chunk_rows, " lines, ", bytes() >> 20,
                 " MiB, tables of ", *low == *high ? cat(*low) : cat(*low, "..", *high),
                 " rows, hash seed ", schema_.hash_seed, "; ", tsv_->summary.to_string());
    return cat(files_.size(), " file(s), ", examples_, " examples in ", chunks_.size(),
               " chunks of up to ", schema_.chunk_rows, ", ", bytes() >> 20, " MiB (",
               schema_.example_bytes(), " B/example), tables of ",
               *low == *high ? cat(*low) : cat(*low, "..", *high), " rows, hash seed ",
               schema_.hash_seed, vocabulary_ ? cat(", ", vocabulary_->describe()) : "");
  }

  /// Counts every key as stored (before any vocabulary) into `counts`, whose tables must have
  /// the files' hashed rows; checks each chunk's checksum on the way (`errc::corrupt_data`).
  /// Tables are counted in parallel (oneTBB), 16 chunks at a time.
  void count_keys(ctr_key_counts& counts) const {
    STRATA_EXPECTS(!tsv_,
                   "ctr_files::count_keys: TSV files are streamed, not converted; convert "
                   "them (strata_convert) to count their keys");
    STRATA_EXPECTS(std::equal(counts.hash_rows().begin(), counts.hash_rows().end(),
                              schema_.table_rows.begin(), schema_.table_rows.end()),
                   "ctr_files::count_keys: the counters' tables differ from the files' (",
                   schema_.table_rows.size(), " tables of ", schema_.table_rows.front(), " rows)");
    constexpr std::size_t batch = 16;
    const std::size_t cols = schema_.sparse_cols;
    for (std::size_t first = 0; first < chunks_.size(); first += batch) {
      const std::size_t end = std::min(chunks_.size(), first + batch);
      for (std::size_t c = first; c < end; ++c)
        check_chunk(maps_, c);
      std::atomic<bool> outside{false};
      tbb::parallel_for(std::size_t{0}, cols, [&](std::size_t f) {
        const std::uint64_t rows = schema_.table_rows[f];
        for (std::size_t c = first; c < end; ++c) {
          const std::byte* keys = chunk_bytes(maps_, c).data() + chunks_[c].keys;
          for (std::size_t r = 0; r < chunks_[c].rows; ++r) {
            std::uint64_t key = 0;
            std::memcpy(&key, keys + (r * cols + f) * key_bytes_, key_bytes_);
            if (key >= rows) [[unlikely]] {
              outside.store(true, std::memory_order_relaxed);
              return;
            }
            counts.add(f, key);
          }
        }
      });
      if (outside.load())
        fail(errc::corrupt_data,
             cat("'", files_[chunks_[first].file].path.string(), "': a key near chunk ", first,
                 " lies outside its table; convert the TSV again"));
      for (std::size_t c = first; c < end; ++c)
        release_chunk(maps_, c);
    }
  }

  /// Checks every chunk's checksum (reads every byte once; streamed TSV: parses every chunk
  /// again); raises `errc::corrupt_data`.
  void verify() const {
    if (tsv_) {
      const mappings local = map_files();
      for (std::size_t c = 0; c < chunks_.size(); ++c) {
        (void)parsed(local, c);
        release_chunk(local, c);
      }
      return;
    }
    for (std::size_t c = 0; c < chunks_.size(); ++c) {
      check_chunk(maps_, c);
      release_chunk(maps_, c);
    }
  }

  void gather(std::span<const std::size_t> indices, ctr_batch& out) const override {
    for (std::size_t i = 0; i < indices.size(); ++i)
      if (indices[i] >= examples_)
        fail(errc::out_of_range, cat("ctr_files::gather: index ", indices[i], " (position ", i,
                                     ") is outside the data of ", examples_, " examples"));
    out.resize(indices.size(), schema_.dense_cols, schema_.sparse_cols);
    std::shared_ptr<const detail::criteo_chunk> held;  // streamed TSV: the chunk being read
    std::size_t held_chunk = chunks_.size();
    for (std::size_t i = 0; i < indices.size(); ++i) {
      const std::size_t e = indices[i];
      const auto it = std::upper_bound(first_example_.begin(), first_example_.end(), e);
      const auto c = static_cast<std::size_t>(it - first_example_.begin()) - 1;
      if (!tsv_) {
        read_example(maps_, c, e - first_example_[c], out, i);
        continue;
      }
      if (c != held_chunk) {
        held = recent_chunk(c);
        held_chunk = c;
      }
      copy_row(*held, e - first_example_[c], out, i);
    }
  }

  void done_with(std::size_t first, std::size_t end) const override {
    // Whole chunks inside [first, end), and the 128 KiB before the first of them: the kernel
    // maps pages around each faulting one (fault-around), so reading a chunk's first pages
    // may have mapped the previous chunk's last ones again.
    auto c = static_cast<std::size_t>(
        std::lower_bound(first_example_.begin(), first_example_.end(), first) -
        first_example_.begin());
    if (c < chunks_.size() && first_example_[c] + chunks_[c].rows <= end) {
      const auto& k = chunks_[c];
      const std::size_t margin = std::size_t{128} << 10;
      const std::size_t from = k.offset > margin ? k.offset - margin : 0;
      maps_[k.file].release(from, k.offset - from);
    }
    for (; c < chunks_.size() && first_example_[c] + chunks_[c].rows <= end; ++c)
      release_chunk(maps_, c);
  }

  [[nodiscard]] std::size_t steps_per_epoch(const loader_config& config) const override {
    const std::size_t shards = shards_of(config);
    check_config(config, shards);
    return min_shard_examples(shards) / (config.global_batch / shards);
  }

  [[nodiscard]] std::unique_ptr<batch_loader> loader(const loader_config& config) const override {
    const std::size_t shards = shards_of(config);
    check_config(config, shards);
    return std::make_unique<windowed_loader>(*this, config, shards);
  }

 private:
  struct file {
    std::filesystem::path path;
    std::uint64_t bytes = 0;
  };
  struct chunk {
    std::size_t file = 0;
    std::uint64_t offset = 0, rows = 0, checksum = 0;
    std::size_t dense = 0, keys = 0, bytes = 0;  // its parts' offsets, its size
    std::uint64_t first_line = 0;                // streamed TSV: its first line (0-based)
  };
  /// Streamed TSV: the reading rules, what opening found, and the chunks gather parsed last
  /// (evaluation gathers a chunk's examples over many calls).
  struct tsv_state {
    explicit tsv_state(const criteo_options& o) : options(o), hashing(o.table_rows, o.hash_seed) {}
    criteo_options options;
    criteo_hashing hashing;
    criteo_summary summary;
    std::mutex recent_mutex;
    std::deque<std::pair<std::size_t, std::shared_ptr<const detail::criteo_chunk>>> recent;
  };
  /// Streamed TSV chunk c for gather: from the few parsed last, else parsed now (outside the
  /// lock; concurrent callers may parse the same chunk twice, never wait on a parse).
  std::shared_ptr<const detail::criteo_chunk> recent_chunk(std::size_t c) const {
    {
      std::lock_guard lock(tsv_->recent_mutex);
      for (const auto& [id, chunk] : tsv_->recent)
        if (id == c) return chunk;
    }
    auto fresh = std::make_shared<detail::criteo_chunk>();
    parse_into(maps_, c, *fresh);
    std::lock_guard lock(tsv_->recent_mutex);
    tsv_->recent.emplace_front(c, fresh);
    if (tsv_->recent.size() > 4) tsv_->recent.pop_back();
    return fresh;
  }
  static void copy_row(const detail::criteo_chunk& p, std::size_t row, ctr_batch& out,
                       std::size_t at) noexcept {
    out.labels[at] = p.labels[row];
    std::memcpy(out.dense.row(at).data(), p.dense.data() + row * criteo_dense_columns,
                criteo_dense_columns * sizeof(float));
    std::memcpy(out.keys.row(at).data(), p.keys.data() + row * criteo_sparse_columns,
                criteo_sparse_columns * sizeof(std::uint64_t));
  }

  [[noreturn]] static void corrupt(const std::filesystem::path& p, std::string_view what) {
    fail(errc::corrupt_data,
         cat("'", p.string(), "' is not a whole .ctrb file: ", what, "; convert the TSV again"));
  }

  void open(const std::filesystem::path& path) {
    mapped_file map(path, "give a converted .ctrb file or a folder of them");
    const auto bytes = map.bytes();
    if (bytes.size() < detail::ctrb_header_bytes) corrupt(path, "shorter than its header");
    if (std::memcmp(bytes.data(), detail::ctrb_magic.data(), detail::ctrb_magic.size()) != 0)
      corrupt(path, "no STRATACB magic (not a converted file)");
    const auto header = bytes.first(detail::ctrb_header_bytes);
    detail::field_reader h{header, detail::ctrb_magic.size()};
    const auto version = h.get<std::uint32_t>();
    if (version != detail::ctrb_version)
      fail(errc::unsupported,
           cat("'", path.string(), "' is .ctrb version ", version, "; this strata reads version ",
               detail::ctrb_version, ": convert the TSV again with this strata"));
    std::uint64_t stored_checksum = 0;
    std::memcpy(&stored_checksum, header.data() + header.size() - 8, 8);
    if (fast_checksum(header.first(header.size() - 8)) != stored_checksum)
      corrupt(path, "its header fails its checksum");
    if (h.get<std::uint32_t>() != detail::ctrb_header_bytes) corrupt(path, "header size");
    const auto examples = h.get<std::uint64_t>();
    ctr_file_schema s;
    s.dense_cols = h.get<std::uint32_t>();
    s.sparse_cols = h.get<std::uint32_t>();
    s.chunk_rows = h.get<std::uint32_t>();
    const auto key_bytes = h.get<std::uint32_t>();
    s.hash_seed = h.get<std::uint64_t>();
    const auto chunk_count = h.get<std::uint64_t>();
    const auto table_offset = h.get<std::uint64_t>();
    (void)h.get<std::uint64_t>();  // source bytes
    (void)h.get<std::uint64_t>();  // source lines
    (void)h.get<std::uint64_t>();  // lines skipped
    if (s.sparse_cols == 0 || s.sparse_cols > detail::ctrb_max_sparse || s.chunk_rows == 0)
      corrupt(path, "impossible column or chunk sizes");
    for (std::size_t f2 = 0; f2 < s.sparse_cols; ++f2)
      s.table_rows.push_back(h.get<std::uint64_t>());
    if (key_bytes != s.key_bytes()) corrupt(path, "key width disagrees with the table sizes");
    // The chunk table.
    const std::uint64_t table_bytes = chunk_count * 24 + 8;
    if (chunk_count > bytes.size() || table_offset < detail::ctrb_header_bytes ||
        table_offset > bytes.size() || bytes.size() - table_offset != table_bytes)
      corrupt(path, cat("chunk table of ", chunk_count, " chunks does not end the file (",
                        bytes.size(), " bytes: truncated?)"));
    const auto table = bytes.subspan(table_offset, table_bytes);
    std::uint64_t table_checksum = 0;
    std::memcpy(&table_checksum, table.data() + table.size() - 8, 8);
    if (fast_checksum(table.first(table.size() - 8)) != table_checksum)
      corrupt(path, "its chunk table fails its checksum");
    if (files_.empty()) {
      schema_ = s;
    } else if (!(s == schema_)) {
      fail(errc::invalid_argument,
           cat("'", path.string(), "' was converted with another schema or hashing than '",
               files_.front().path.string(), "' (", s.dense_cols, "/", s.sparse_cols,
               " columns, chunks of ", s.chunk_rows, ", hash seed ", s.hash_seed, ", tables of ",
               s.table_rows.front(), " rows vs ", schema_.dense_cols, "/", schema_.sparse_cols,
               ", ", schema_.chunk_rows, ", ", schema_.hash_seed, ", ", schema_.table_rows.front(),
               "); convert every day with the same --table-rows, --seed and --chunk-rows"));
    }
    detail::field_reader t{table};
    std::uint64_t rows_seen = 0;
    const std::size_t index = files_.size();
    for (std::uint64_t c = 0; c < chunk_count; ++c) {
      chunk k{index, t.get<std::uint64_t>(), t.get<std::uint64_t>(), t.get<std::uint64_t>()};
      const detail::chunk_parts parts(
          static_cast<std::size_t>(std::min(k.rows, std::uint64_t{1} << 32)), s);
      k.dense = parts.dense;
      k.keys = parts.keys;
      k.bytes = parts.bytes;
      if (k.rows == 0 || k.rows > s.chunk_rows || k.offset < detail::ctrb_header_bytes ||
          k.offset % detail::ctrb_alignment != 0 || k.offset > table_offset ||
          parts.bytes > table_offset - k.offset)
        corrupt(path, cat("chunk ", c, " lies outside the data"));
      first_example_.push_back(examples_ + rows_seen);
      rows_seen += k.rows;
      chunks_.push_back(k);
    }
    if (rows_seen != examples)
      corrupt(path, cat("its chunks hold ", rows_seen, " examples, its header says ", examples));
    examples_ += static_cast<std::size_t>(examples);
    key_bytes_ = schema_.key_bytes();
    files_.push_back({path, bytes.size()});
    map.release(0, bytes.size());  // the header and table were read once; chunks come later
    maps_.files.push_back(std::move(map));
  }

  /// Indexes TSV file `path` into chunks of `chunk_lines` lines and checks every line.
  void open_tsv(const std::filesystem::path& path, std::size_t chunk_lines) {
    mapped_file map(path, "give a Criteo TSV file (or a converted .ctrb file or folder)");
    const auto bytes = map.bytes();
    const char* text = reinterpret_cast<const char*>(bytes.data());
    const std::size_t size = bytes.size();
    // Chunk k starts after newline number k·L (1-based): newlines counted per 64 MiB segment
    // in parallel, then each segment records the chunk starts inside it.
    constexpr std::size_t segment = std::size_t{64} << 20;
    const std::size_t segments = (size + segment - 1) / segment;
    std::vector<std::uint64_t> before(segments + 1, 0);  // newlines before each segment
    tbb::parallel_for(std::size_t{0}, segments, [&](std::size_t g) {
      const char* p = text + g * segment;
      before[g + 1] = static_cast<std::uint64_t>(
          std::count(p, p + std::min(segment, size - g * segment), '\n'));
    });
    for (std::size_t g = 0; g < segments; ++g)
      before[g + 1] += before[g];
    std::vector<std::vector<std::uint64_t>> starts(segments);
    tbb::parallel_for(std::size_t{0}, segments, [&](std::size_t g) {
      std::uint64_t newline = before[g];
      const char* p = text + g * segment;
      const char* end = text + std::min(size, (g + 1) * segment);
      while (p < end) {
        const void* hit = std::memchr(p, '\n', static_cast<std::size_t>(end - p));
        if (hit == nullptr) break;
        p = static_cast<const char*>(hit) + 1;
        if (++newline % chunk_lines == 0 && p < text + size)
          starts[g].push_back(static_cast<std::uint64_t>(p - text));
      }
    });
    const std::uint64_t lines = before[segments] + (size > 0 && text[size - 1] != '\n' ? 1 : 0);
    std::vector<std::uint64_t> bounds;
    if (size > 0) bounds.push_back(0);
    for (const auto& st : starts)
      bounds.insert(bounds.end(), st.begin(), st.end());
    bounds.push_back(size);
    // Every chunk parsed once: its good lines, and the bad ones (a stop, or counted).
    const std::size_t count = bounds.size() - 1;
    struct found {
      std::uint64_t rows = 0, lines = 0;
      std::vector<detail::parsed_block::bad> bad;
    };
    std::vector<found> per_chunk(count);
    const auto& state = *tsv_;
    tbb::parallel_for(std::size_t{0}, count, [&](std::size_t k) {
      detail::parsed_block block;
      detail::parse_lines(std::string_view(text + bounds[k], bounds[k + 1] - bounds[k]),
                          state.options, state.hashing, block);
      per_chunk[k] = {block.rows.size(), block.lines, std::move(block.bad_lines)};
    });
    auto& summary = tsv_->summary;
    const std::size_t index = files_.size();
    std::uint64_t seen = 0, line = 0;
    for (std::size_t k = 0; k < count; ++k) {
      for (const auto& b : per_chunk[k].bad) {
        const std::string where = cat(path.string(), ":", line + b.line + 1, ": ");
        if (!state.options.skip_bad_lines)
          fail(errc::corrupt_data,
               cat(where, b.why, " (", to_string(b.kind),
                   "); fix the file or skip bad lines (ctr_train --skip-bad-lines, "
                   "criteo_options::skip_bad_lines)"));
        ++summary.lines_skipped;
        ++summary.skipped_by_kind[static_cast<std::size_t>(b.kind)];
        if (summary.first_reasons.size() < state.options.max_reasons)
          summary.first_reasons.push_back(where + b.why);
      }
      const std::uint64_t first_line = line;
      line += per_chunk[k].lines;
      if (per_chunk[k].rows == 0) continue;  // every line of it skipped
      chunk c;
      c.file = index;
      c.offset = bounds[k];
      c.rows = per_chunk[k].rows;
      c.bytes = static_cast<std::size_t>(bounds[k + 1] - bounds[k]);
      c.first_line = first_line;
      first_example_.push_back(examples_ + seen);
      seen += c.rows;
      chunks_.push_back(c);
    }
    if (line != lines)
      fail(errc::internal,
           cat("ctr_files: '", path.string(), "' holds ", lines, " lines but its chunks ", line));
    summary.lines_read += lines;
    summary.examples += seen;
    examples_ += static_cast<std::size_t>(seen);
    files_.push_back({path, size});
    map.release(0, size);  // read once; chunks come back when a loader takes them
    maps_.files.push_back(std::move(map));
  }

  /// Mappings of the files, one per file: the source's own (gather, verify) or a loader's;
  /// for streamed TSV also the chunks parsed so far (a loader's own: one thread uses it).
  struct mappings {
    std::vector<mapped_file> files;
    mutable std::unordered_map<std::size_t, detail::criteo_chunk> parsed;
    [[nodiscard]] const mapped_file& operator[](std::size_t f) const noexcept { return files[f]; }
    [[nodiscard]] std::size_t size() const noexcept { return files.size(); }
  };
  [[nodiscard]] mappings map_files() const {
    mappings maps;
    for (const auto& f : files_)
      maps.files.emplace_back(f.path, tsv_ ? "a TSV file disappeared while training"
                                           : "a converted file disappeared while training");
    return maps;
  }
  /// Streamed TSV chunk c, parsed (into `maps`' cache the first time).
  const detail::criteo_chunk& parsed(const mappings& maps, std::size_t c) const {
    if (const auto it = maps.parsed.find(c); it != maps.parsed.end()) return it->second;
    detail::criteo_chunk fresh;
    parse_into(maps, c, fresh);
    return maps.parsed.emplace(c, std::move(fresh)).first->second;
  }
  /// Parses streamed TSV chunk c into `into`; a chunk that no longer parses to the rows it had
  /// when opened (the file changed) raises `errc::corrupt_data`.
  void parse_into(const mappings& maps, std::size_t c, detail::criteo_chunk& into) const {
    const auto& k = chunks_[c];
    const auto bytes = maps[k.file].bytes().subspan(k.offset, k.bytes);
    detail::parsed_block block;
    block.rows.dense.reserve(k.rows * criteo_dense_columns);
    block.rows.keys.reserve(k.rows * criteo_sparse_columns);
    block.rows.labels.reserve(k.rows);
    detail::parse_lines(std::string_view(reinterpret_cast<const char*>(bytes.data()), bytes.size()),
                        tsv_->options, tsv_->hashing, block);
    if (block.rows.size() != k.rows || (!tsv_->options.skip_bad_lines && !block.bad_lines.empty()))
      fail(errc::corrupt_data,
           cat("'", files_[k.file].path.string(), "': lines ", k.first_line + 1, "..",
               k.first_line + block.lines, " now hold ", block.rows.size(), " good lines, not ",
               k.rows, ": the file changed while training; restart the run"));
    into = std::move(block.rows);
  }
  /// A chunk's extent in its file: its bytes and its padding up to the next chunk.
  [[nodiscard]] std::size_t extent(std::size_t c) const noexcept {
    return tsv_ ? chunks_[c].bytes : detail::round_up(chunks_[c].bytes, detail::ctrb_alignment);
  }
  [[nodiscard]] std::span<const std::byte> chunk_bytes(const mappings& maps,
                                                       std::size_t c) const noexcept {
    const auto& k = chunks_[c];
    return maps[k.file].bytes().subspan(k.offset, k.bytes);
  }
  void check_chunk(const mappings& maps, std::size_t c) const {
    if (tsv_) {
      (void)parsed(maps, c);
      return;
    }
    if (fast_checksum(chunk_bytes(maps, c)) != chunks_[c].checksum)
      fail(errc::corrupt_data,
           cat("'", files_[chunks_[c].file].path.string(), "': chunk at byte ", chunks_[c].offset,
               " (examples ", first_example_[c], "..", first_example_[c] + chunks_[c].rows - 1,
               ") fails its checksum: the file is damaged; convert the TSV again"));
  }
  void release_chunk(const mappings& maps, std::size_t c) const noexcept {
    maps[chunks_[c].file].release(chunks_[c].offset, extent(c));
    maps.parsed.erase(c);
  }
  /// Takes chunks `cs` in for reading: checks each (streamed TSV: parses them, in parallel).
  void take_chunks(const mappings& maps, std::span<const std::size_t> cs) const {
    if (!tsv_) {
      for (const auto c : cs)
        check_chunk(maps, c);
      return;
    }
    std::vector<std::size_t> missing;
    for (const auto c : cs)
      if (!maps.parsed.contains(c)) missing.push_back(c);
    std::vector<detail::criteo_chunk> fresh(missing.size());
    tbb::parallel_for(std::size_t{0}, missing.size(),
                      [&](std::size_t i) { parse_into(maps, missing[i], fresh[i]); });
    for (std::size_t i = 0; i < missing.size(); ++i)
      maps.parsed.emplace(missing[i], std::move(fresh[i]));
  }
  void prefetch_chunk(const mappings& maps, std::size_t c) const noexcept {
    maps[chunks_[c].file].will_need(chunks_[c].offset, chunks_[c].bytes);
  }
  /// Example `row` of chunk `c` into row `at` of `out` (already shaped).
  void read_example(const mappings& maps, std::size_t c, std::size_t row, ctr_batch& out,
                    std::size_t at) const {
    if (tsv_) {
      copy_row(parsed(maps, c), row, out, at);
      return;
    }
    const auto& k = chunks_[c];
    const std::byte* base = maps[k.file].bytes().data() + k.offset;
    out.labels[at] = static_cast<float>(static_cast<std::uint8_t>(base[row]));
    std::memcpy(out.dense.row(at).data(), base + k.dense + row * schema_.dense_cols * 4,
                schema_.dense_cols * 4);
    std::uint64_t* keys = out.keys.row(at).data();
    const std::byte* src = base + k.keys + row * schema_.sparse_cols * key_bytes_;
    if (key_bytes_ == 8) {
      std::memcpy(keys, src, schema_.sparse_cols * 8);
    } else {
      for (std::size_t f = 0; f < schema_.sparse_cols; ++f) {
        std::uint32_t k32;
        std::memcpy(&k32, src + 4 * f, 4);
        keys[f] = k32;
      }
    }
    if (vocabulary_)
      for (std::size_t f = 0; f < schema_.sparse_cols; ++f)
        keys[f] = vocabulary_->map(f, keys[f]);
  }

  /// Reads the vocabulary of the files' folders: every file's folder must hold the same one,
  /// or none does; its hashing must be the files'.
  void adopt_vocabulary(const std::vector<std::filesystem::path>& files) {
    namespace fs = std::filesystem;
    std::optional<fs::path> with, without, loaded;  // a file read through one / without
    for (const auto& p : files) {
      const fs::path v = p.parent_path() / ctr_vocabulary_name;
      std::error_code ec;
      if (!fs::exists(v, ec)) {
        without = p;
        continue;
      }
      with = p;
      if (loaded && fs::equivalent(*loaded, v, ec)) continue;
      auto read = std::make_shared<const ctr_vocabulary>(ctr_vocabulary::load(v));
      if (vocabulary_ && read->fingerprint() != vocabulary_->fingerprint())
        fail(errc::invalid_argument,
             cat("'", v.string(), "' and '", loaded->string(),
                 "' are different vocabularies: the days read together must be read through "
                 "one (convert them into one folder)"));
      vocabulary_ = std::move(read);
      loaded = v;
    }
    if (with && without)
      fail(errc::invalid_argument,
           cat("'", with->string(), "' is read through the vocabulary of its folder but '",
               without->string(),
               "' has none beside it: its keys would mean other rows; convert that day into "
               "the folder holding the vocabulary"));
    rows_ = schema_.table_rows;
    if (!vocabulary_) return;
    const auto& v = *vocabulary_;
    bool same = v.tables() == schema_.sparse_cols && v.hash_seed() == schema_.hash_seed;
    for (std::size_t f = 0; same && f < v.tables(); ++f)
      same = v.hash_rows(f) == schema_.table_rows[f];
    if (!same)
      fail(errc::invalid_argument,
           cat("'", loaded->string(), "' was counted over days hashed otherwise (", v.tables(),
               " tables of ", v.hash_rows(0), " rows, seed ", v.hash_seed(), ") than '",
               files_.front().path.string(), "' (", schema_.sparse_cols, " tables of ",
               schema_.table_rows.front(), " rows, seed ", schema_.hash_seed,
               "); convert every day of the folder with the same --table-rows and --seed"));
    rows_ = v.table_rows();
    vocabulary_file_ = *loaded;
  }

  [[nodiscard]] static std::size_t shards_of(const loader_config& c) noexcept {
    return c.data_shards != 0 ? c.data_shards : c.world_size;
  }
  void check_config(const loader_config& c, std::size_t shards) const {
    STRATA_EXPECTS(c.world_size > 0 && c.rank < c.world_size, "ctr_files: rank ", c.rank,
                   " outside a world of ", c.world_size);
    STRATA_EXPECTS(c.global_batch > 0 && c.global_batch % c.world_size == 0,
                   "ctr_files: global batch ", c.global_batch,
                   " must be a positive multiple of the ", c.world_size, " workers");
    STRATA_EXPECTS(c.global_batch % shards == 0, "ctr_files: global batch ", c.global_batch,
                   " must be a multiple of the ", shards,
                   " data shards (each shard gives every step the same number of examples)");
    if (shards > chunks_.size())
      fail(errc::invalid_argument, cat("ctr_files: ", shards, " data shards but the data has only ",
                                       chunks_.size(), " chunks (", examples_,
                                       " examples); use fewer shards (--data-shards) or convert "
                                       "with smaller chunks (--chunk-rows)"));
    if (min_shard_examples(shards) < c.global_batch / shards)
      fail(errc::invalid_argument,
           cat("ctr_files: with ", shards, " data shards the smallest shard holds ",
               min_shard_examples(shards), " examples, fewer than its ", c.global_batch / shards,
               " per step; an epoch would have no step: use more data or a smaller batch"));
  }
  /// Examples of the smallest shard any epoch can deal: each shard gets ⌊C/S⌋ or ⌈C/S⌉ chunks,
  /// so at least the ⌊C/S⌋ smallest chunks' examples (epoch-independent).
  [[nodiscard]] std::size_t min_shard_examples(std::size_t shards) const {
    std::vector<std::uint64_t> rows;
    rows.reserve(chunks_.size());
    for (const auto& k : chunks_)
      rows.push_back(k.rows);
    const std::size_t per = chunks_.size() / shards;
    std::partial_sort(rows.begin(), rows.begin() + static_cast<std::ptrdiff_t>(per), rows.end());
    return static_cast<std::size_t>(std::accumulate(
        rows.begin(), rows.begin() + static_cast<std::ptrdiff_t>(per), std::uint64_t{0}));
  }

  /// One rank's walk. Epoch e: chunk order = shuffle(chunks, (seed, e)); shard d takes the
  /// chunks at positions ≡ d (mod S); a shard's stream is cut into windows of K chunks whose
  /// examples are shuffled by (seed, e, S, d, window). Step t's global batch is, shard after
  /// shard, positions [t·b, (t+1)·b) of each shard's stream (b = G / S); rank r loads its r-th
  /// slice of it. Holds: one chunk order, and per shard it reads two window permutations.
  class windowed_loader final : public batch_loader {
   public:
    windowed_loader(const ctr_files& files, const loader_config& c, std::size_t shards)
        : files_(files),
          config_(c),
          shards_(shards),
          per_shard_(c.global_batch / shards),
          local_(c.global_batch / c.world_size),
          steps_(files.steps_per_epoch(c)),
          window_chunks_(std::max<std::size_t>(
              1, (c.shuffle_window != 0 ? c.shuffle_window : default_shuffle_window) /
                     files.schema_.chunk_rows)),
          state_(shards),
          maps_(files.map_files()) {}

    [[nodiscard]] std::size_t steps_per_epoch() const override { return steps_; }

    void load(std::size_t step, ctr_batch& out) override {
      const std::size_t epoch = step / steps_;
      if (!epoch_ || *epoch_ != epoch) start_epoch(epoch);
      const std::size_t t = step % steps_;
      out.resize(local_, files_.schema_.dense_cols, files_.schema_.sparse_cols);
      // This rank's slice of the global batch: positions [r·L, (r+1)·L) of the concatenation
      // of every shard's b examples of step t.
      const std::size_t first = config_.rank * local_;
      for (std::size_t i = 0; i < local_; ++i) {
        const std::size_t g = first + i;
        const std::size_t d = g / per_shard_;
        const std::size_t p = t * per_shard_ + g % per_shard_;
        const auto [c, row] = locate(d, p);
        files_.read_example(maps_, c, row, out, i);
      }
    }

   private:
    struct window {
      std::size_t index = static_cast<std::size_t>(-1);
      std::vector<std::uint32_t> order;  // shuffled example offsets within the window
      std::vector<std::size_t> prefix;   // examples before each of its chunks
    };
    struct shard_state {
      std::vector<std::size_t> chunks;  // its stream of chunk ids this epoch
      std::vector<std::size_t> starts;  // first position of each window, then the total
      std::array<window, 2> held;       // the windows read last
      std::size_t touched_upto = 0;     // windows below this were taken in (checked)
    };

    void start_epoch(std::size_t epoch) {
      for (const auto& m : maps_.files)
        m.release(0, m.size());
      maps_.parsed.clear();
      epoch_ = epoch;
      std::vector<std::size_t> order(files_.chunks_.size());
      std::iota(order.begin(), order.end(), std::size_t{0});
      shuffle(std::span(order), counter_rng{mix_ids(config_.seed, order_salt), epoch});
      for (std::size_t d = 0; d < shards_; ++d) {
        auto& s = state_[d];
        s.chunks.clear();
        for (std::size_t i = d; i < order.size(); i += shards_)
          s.chunks.push_back(order[i]);
        s.starts.assign(1, 0);
        for (std::size_t w = 0; w * window_chunks_ < s.chunks.size(); ++w) {
          std::size_t n = 0;
          for (std::size_t k = w * window_chunks_;
               k < std::min(s.chunks.size(), (w + 1) * window_chunks_); ++k)
            n += static_cast<std::size_t>(files_.chunks_[s.chunks[k]].rows);
          s.starts.push_back(s.starts.back() + n);
        }
        for (auto& h : s.held)
          h.index = static_cast<std::size_t>(-1);
        s.touched_upto = 0;
      }
    }

    /// (chunk, row) of position p of shard d's stream this epoch.
    std::pair<std::size_t, std::size_t> locate(std::size_t d, std::size_t p) {
      auto& s = state_[d];
      const auto w = static_cast<std::size_t>(
          std::upper_bound(s.starts.begin(), s.starts.end(), p) - s.starts.begin() - 1);
      const window& win = take(d, w);
      const std::size_t q = win.order[p - s.starts[w]];
      const auto k = static_cast<std::size_t>(
          std::upper_bound(win.prefix.begin(), win.prefix.end(), q) - win.prefix.begin() - 1);
      return {s.chunks[w * window_chunks_ + k], q - win.prefix[k]};
    }

    /// Window w of shard d, built (and its chunks checked, the next window read ahead, the
    /// windows before w − 1 released) the first time a step reaches it.
    const window& take(std::size_t d, std::size_t w) {
      auto& s = state_[d];
      for (auto& h : s.held)
        if (h.index == w) return h;
      // An empty slot, else the older window (steps move forward).
      constexpr auto none = static_cast<std::size_t>(-1);
      window& slot = s.held[0].index == none             ? s.held[0]
                     : s.held[1].index == none           ? s.held[1]
                     : s.held[0].index < s.held[1].index ? s.held[0]
                                                         : s.held[1];
      const std::size_t first_chunk = w * window_chunks_;
      const std::size_t end_chunk = std::min(s.chunks.size(), first_chunk + window_chunks_);
      slot.index = w;
      // Only the windows held stay mapped (a step reads at most two adjacent windows per
      // shard): everything else of this loader's mappings leaves the resident set, pages
      // the kernel mapped around faulting ones included.
      release_all_but_held();
      if (w >= s.touched_upto) {
        files_.take_chunks(maps_,
                           std::span(s.chunks).subspan(first_chunk, end_chunk - first_chunk));
        s.touched_upto = w + 1;
        for (std::size_t k = end_chunk; k < std::min(s.chunks.size(), end_chunk + window_chunks_);
             ++k)
          files_.prefetch_chunk(maps_, s.chunks[k]);
      }
      slot.prefix.assign(1, 0);
      for (std::size_t k = first_chunk; k < end_chunk; ++k)
        slot.prefix.push_back(slot.prefix.back() +
                              static_cast<std::size_t>(files_.chunks_[s.chunks[k]].rows));
      const std::size_t n = slot.prefix.back();
      slot.order.resize(n);
      std::iota(slot.order.begin(), slot.order.end(), std::uint32_t{0});
      shuffle(std::span(slot.order),
              counter_rng{mix_ids(config_.seed, window_salt),
                          mix_ids(mix_ids(*epoch_, shards_), mix_ids(d, w))});
      return slot;
    }
    /// Releases every page of this loader's mappings outside the chunks of held windows.
    void release_all_but_held() {
      std::vector<std::size_t> held;  // chunk ids, sorted by (file, offset) = by id
      for (const auto& s : state_)
        for (const auto& h : s.held) {
          if (h.index == static_cast<std::size_t>(-1)) continue;
          for (std::size_t k = h.index * window_chunks_;
               k < std::min(s.chunks.size(), (h.index + 1) * window_chunks_); ++k)
            held.push_back(s.chunks[k]);
        }
      std::sort(held.begin(), held.end());
      std::erase_if(maps_.parsed, [&](const auto& entry) {  // streamed TSV: parsed chunks too
        return !std::binary_search(held.begin(), held.end(), entry.first);
      });
      std::vector<std::size_t> from(maps_.size(), 0);  // per file: first byte not yet handled
      for (const auto c : held) {
        const auto& k = files_.chunks_[c];
        if (k.offset > from[k.file]) maps_[k.file].release(from[k.file], k.offset - from[k.file]);
        from[k.file] = std::max<std::size_t>(from[k.file], k.offset + files_.extent(c));
      }
      for (std::size_t f = 0; f < maps_.size(); ++f)
        if (from[f] < maps_[f].size()) maps_[f].release(from[f], maps_[f].size() - from[f]);
    }

    static constexpr std::uint64_t order_salt = 0x63686e6b6f726472ull;   // "chnkordr"
    static constexpr std::uint64_t window_salt = 0x77696e646f777368ull;  // "windowsh"

    const ctr_files& files_;
    loader_config config_;
    std::size_t shards_, per_shard_, local_, steps_, window_chunks_;
    std::vector<shard_state> state_;
    mappings maps_;  // this loader's own: releasing pages never touches another reader's
    std::optional<std::size_t> epoch_;
  };

  std::vector<file> files_;
  mappings maps_;  // gather, verify, done_with
  std::vector<chunk> chunks_;
  std::vector<std::size_t> first_example_;  // per chunk
  std::size_t examples_ = 0;
  ctr_file_schema schema_;
  std::size_t key_bytes_ = 4;
  std::shared_ptr<tsv_state> tsv_;                    // streamed TSV (null: converted files)
  std::vector<std::uint64_t> rows_;                   // table_rows()
  std::shared_ptr<const ctr_vocabulary> vocabulary_;  // null: keys read as stored
  std::filesystem::path vocabulary_file_;
};

/// Counts the keys of `files` — read as stored: they must not be read through a vocabulary
/// already — and keeps, per table, those seen at least `min_count` (≥ 1) times. Save the result
/// as `vocabulary.ctrv` in the files' folder to read them (and later days converted there)
/// through it.
inline ctr_vocabulary build_ctr_vocabulary(const ctr_files& files, std::uint64_t min_count) {
  STRATA_EXPECTS(files.vocabulary() == nullptr,
                 "build_ctr_vocabulary: the files are read through a vocabulary already (",
                 files.vocabulary() ? files.vocabulary()->describe() : "",
                 "); count days whose folder has none");
  STRATA_EXPECTS(min_count >= 1, "build_ctr_vocabulary: min_count ", min_count,
                 " must be at least 1 (1 keeps every key seen, 2 drops ids seen once)");
  ctr_key_counts counts(files.schema().table_rows);
  files.count_keys(counts);
  ctr_vocabulary::provenance p;
  p.min_count = min_count;
  p.hash_seed = files.schema().hash_seed;
  p.examples = files.size();
  for (const auto& path : files.paths())
    p.counted_files.push_back(path.filename().string());
  return ctr_vocabulary(counts, std::move(p));
}

}  // namespace strata::data
