/// @file criteo.hpp
/// Streaming reader of Criteo-format TSV files (label, 13 integers, 26 hex categoricals) with a
/// background parser thread, and a helper that loads a small file into a `ctr_dataset`.
///
/// ```cpp
/// strata::data::criteo_reader reader("day_0.tsv", {.table_rows = {1u << 20}});
/// strata::data::ctr_batch batch;
/// while (reader.next(batch, 4096) > 0) train_step(batch);
/// std::cout << reader.summary().to_string() << '\n';
/// ```
#pragma once

#include <array>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <deque>
#include <exception>
#include <filesystem>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "strata/core/error.hpp"
#include "strata/core/rng.hpp"
#include "strata/data/batch.hpp"

namespace strata::data {

/// How a Criteo file is read.
struct criteo_options {
  /// Rows of each feature's embedding table: one value for all 26 features, or 26 values.
  /// Feature f's key is always in [0, table_rows[f]).
  std::vector<std::uint64_t> table_rows = {std::uint64_t{1} << 20};
  /// Seed mixed into every key hash (change it to get a different collision pattern).
  std::uint64_t hash_seed = 0;
  /// false: a malformed line raises `errc::corrupt_data`; true: it is skipped and counted.
  bool skip_bad_lines = false;
  /// Examples the parser thread puts in one queued chunk.
  std::size_t chunk_rows = 4096;
  /// Chunks the parser thread may hold ready ahead of the consumer (bounded memory).
  std::size_t prefetch_chunks = 8;
  /// A longer line (without its newline) is malformed.
  std::size_t max_line_bytes = std::size_t{1} << 16;
  /// How many skip reasons `summary()` keeps verbatim.
  std::size_t max_reasons = 8;
};

/// Kinds of malformed lines.
enum class bad_line_kind : std::size_t {
  column_count,  ///< not exactly 40 tab-separated fields
  bad_label,     ///< label other than "0" or "1"
  bad_integer,   ///< an integer column that is not a (64-bit) decimal integer
  bad_hex,       ///< a categorical column that is not 1–16 hex digits
  overlong,      ///< longer than criteo_options::max_line_bytes
};
inline constexpr std::size_t bad_line_kinds = 5;

/// Name of a bad-line kind.
constexpr std::string_view to_string(bad_line_kind kind) noexcept {
  constexpr std::array<std::string_view, bad_line_kinds> names = {
      "wrong column count", "bad label", "bad integer", "bad hex", "overlong line"};
  return names[static_cast<std::size_t>(kind)];
}

/// What a reader has parsed so far.
struct criteo_summary {
  std::size_t lines_read = 0;     ///< physical lines seen (good + skipped)
  std::size_t examples = 0;       ///< lines turned into examples
  std::size_t lines_skipped = 0;  ///< malformed lines skipped (skip_bad_lines = true)
  std::array<std::size_t, bad_line_kinds> skipped_by_kind{};  ///< indexed by bad_line_kind
  std::vector<std::string> first_reasons;  ///< "file:line: what" of the first few skipped lines
  std::size_t peak_queued_chunks = 0;      ///< most chunks ever waiting in the prefetch queue

  /// One-paragraph human-readable account.
  [[nodiscard]] std::string to_string() const {
    std::string s =
        cat(lines_read, " lines read, ", examples, " examples, ", lines_skipped, " skipped");
    for (std::size_t k = 0; k < bad_line_kinds; ++k)
      if (skipped_by_kind[k] != 0)
        s += cat("; ", skipped_by_kind[k], " ", data::to_string(static_cast<bad_line_kind>(k)));
    for (const auto& r : first_reasons)
      s += cat("\n  ", r);
    return s;
  }
};

/// Key of categorical feature `feature` (0-based) with raw 64-bit value `value`:
/// `mix_ids(mix_ids(hash_seed, feature + 1), value) % table_rows`. Pure function.
[[nodiscard]] constexpr std::uint64_t criteo_key(std::size_t feature, std::uint64_t value,
                                                 std::uint64_t table_rows,
                                                 std::uint64_t hash_seed = 0) noexcept {
  return mix_ids(mix_ids(hash_seed, feature + 1), value) % table_rows;
}

/// Key of a missing (empty) categorical field of feature `feature`: a fixed key per feature,
/// `mix_ids(mix_ids(hash_seed ^ S, feature + 1), 0) % table_rows` with S the bytes of "missing"
/// (a hash domain distinct from present values). Pure function.
[[nodiscard]] constexpr std::uint64_t criteo_missing_key(std::size_t feature,
                                                         std::uint64_t table_rows,
                                                         std::uint64_t hash_seed = 0) noexcept {
  constexpr std::uint64_t missing_salt = 0x6d697373696e67ull;  // "missing"
  return mix_ids(mix_ids(hash_seed ^ missing_salt, feature + 1), 0) % table_rows;
}

/// Dense transform: log(1 + max(x, 0)). Criteo's negative counts (a few -1/-2 in I2) are
/// clamped to 0 and so read like a missing value (0).
[[nodiscard]] inline float criteo_dense_value(std::int64_t x) noexcept {
  return static_cast<float>(std::log1p(static_cast<double>(x > 0 ? x : 0)));
}

namespace detail {

/// Examples parsed by the reader thread, example-major.
struct criteo_chunk {
  std::vector<float> dense;
  std::vector<std::uint64_t> keys;
  std::vector<float> labels;
  [[nodiscard]] std::size_t size() const noexcept { return labels.size(); }
};

/// Buffered line splitter over a FILE*: lines without '\n' (and without a trailing '\r'), the
/// last line may lack its newline. A line longer than `max_line` is reported as overlong and
/// consumed without being held in memory.
class line_source {
 public:
  line_source(const std::filesystem::path& path, std::size_t max_line)
      : path_(path),
        max_line_(max_line),
        buffer_(std::max<std::size_t>(1 << 20, 2 * max_line + 2)) {
    file_.reset(std::fopen(path.c_str(), "rb"));
    if (!file_)
      fail(errc::io_error, cat("criteo_reader: cannot open '", path.string(),
                               "': ", std::strerror(errno), "; check the path and permissions"));
  }

  enum class status { line, overlong, end };

  /// Next line into `line` (valid until the next call).
  status next(std::string_view& line) {
    bool skipping = false;  // inside an overlong line
    for (;;) {
      const char* start = buffer_.data() + begin_;
      const auto* nl = static_cast<const char*>(std::memchr(start, '\n', end_ - begin_));
      if (nl != nullptr) {
        const std::size_t len = static_cast<std::size_t>(nl - start);
        begin_ += len + 1;
        if (skipping || len > max_line_ + 1) return status::overlong;
        line = trim_cr({start, len});
        if (line.size() > max_line_) return status::overlong;
        return status::line;
      }
      if (eof_) {
        if (begin_ == end_ && !skipping) return status::end;
        const std::size_t len = end_ - begin_;
        begin_ = end_;
        if (skipping || len > max_line_ + 1) return status::overlong;
        line = trim_cr({start, len});
        if (line.size() > max_line_) return status::overlong;
        return status::line;
      }
      if (end_ - begin_ > max_line_ + 1) {  // no newline within the limit: drop what we hold
        skipping = true;
        begin_ = end_ = 0;
      } else if (begin_ > 0) {
        std::memmove(buffer_.data(), buffer_.data() + begin_, end_ - begin_);
        end_ -= begin_;
        begin_ = 0;
      }
      fill();
    }
  }

 private:
  struct closer {
    void operator()(std::FILE* f) const noexcept { std::fclose(f); }
  };
  static std::string_view trim_cr(std::string_view s) noexcept {
    if (!s.empty() && s.back() == '\r') s.remove_suffix(1);
    return s;
  }
  void fill() {
    const std::size_t got =
        std::fread(buffer_.data() + end_, 1, buffer_.size() - end_, file_.get());
    end_ += got;
    if (got == 0) {
      if (std::ferror(file_.get()))
        fail(errc::io_error,
             cat("criteo_reader: read error in '", path_.string(), "': ", std::strerror(errno)));
      eof_ = true;
    }
  }

  std::filesystem::path path_;
  std::size_t max_line_;
  std::unique_ptr<std::FILE, closer> file_;
  std::vector<char> buffer_;
  std::size_t begin_ = 0, end_ = 0;
  bool eof_ = false;
};

/// Parses one line into the end of `chunk`; on failure returns the kind and fills `why`,
/// leaving `chunk` unchanged.
inline std::optional<bad_line_kind> parse_criteo_line(std::string_view line,
                                                      std::span<const std::uint64_t> rows,
                                                      std::uint64_t hash_seed, criteo_chunk& chunk,
                                                      std::string& why) {
  constexpr std::size_t fields = 1 + criteo_dense_columns + criteo_sparse_columns;
  std::array<std::string_view, fields> f;
  std::size_t n = 0, pos = 0;
  for (;;) {
    const std::size_t tab = line.find('\t', pos);
    const std::string_view field =
        line.substr(pos, tab == std::string_view::npos ? tab : tab - pos);
    if (n < fields) f[n] = field;
    ++n;
    if (tab == std::string_view::npos) break;
    pos = tab + 1;
  }
  if (n != fields) {
    why = cat("expected ", fields, " tab-separated fields (label, 13 integers, 26 hex), found ", n);
    return bad_line_kind::column_count;
  }
  if (f[0] != "0" && f[0] != "1") {
    why = cat("label '", f[0], "' is not 0 or 1");
    return bad_line_kind::bad_label;
  }
  std::array<float, criteo_dense_columns> dense{};
  for (std::size_t j = 0; j < criteo_dense_columns; ++j) {
    const std::string_view s = f[1 + j];
    if (s.empty()) continue;  // missing → 0
    std::int64_t x = 0;
    const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), x);
    if (ec != std::errc{} || end != s.data() + s.size()) {
      why = cat("integer column I", j + 1, " = '", s, "' is not a 64-bit decimal integer");
      return bad_line_kind::bad_integer;
    }
    dense[j] = criteo_dense_value(x);
  }
  std::array<std::uint64_t, criteo_sparse_columns> keys{};
  for (std::size_t j = 0; j < criteo_sparse_columns; ++j) {
    const std::string_view s = f[1 + criteo_dense_columns + j];
    const std::uint64_t table = rows.size() == 1 ? rows[0] : rows[j];
    if (s.empty()) {
      keys[j] = criteo_missing_key(j, table, hash_seed);
      continue;
    }
    std::uint64_t v = 0;
    const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v, 16);
    if (s.size() > 16 || ec != std::errc{} || end != s.data() + s.size()) {
      why = cat("categorical column C", j + 1, " = '", s, "' is not 1-16 hex digits");
      return bad_line_kind::bad_hex;
    }
    keys[j] = criteo_key(j, v, table, hash_seed);
  }
  chunk.dense.insert(chunk.dense.end(), dense.begin(), dense.end());
  chunk.keys.insert(chunk.keys.end(), keys.begin(), keys.end());
  chunk.labels.push_back(f[0] == "1" ? 1.0f : 0.0f);
  return std::nullopt;
}

}  // namespace detail

/// Streams a Criteo TSV file. A background thread parses ahead into a bounded queue of
/// `prefetch_chunks` chunks of `chunk_rows` examples, so memory stays O(chunk_rows ×
/// prefetch_chunks) whatever the file size; `next` copies examples out of the queue.
///
/// Line format: label (0/1), I1..I13 (decimal integers), C1..C26 (hex), tab-separated; an empty
/// field is missing (dense → 0, categorical → `criteo_missing_key`). Dense values become
/// `criteo_dense_value(x)` = log(1 + max(x, 0)); categorical values become `criteo_key`.
/// A malformed line raises `errc::corrupt_data` "file:line: what" from `next` (examples before
/// it are delivered first), or is skipped and counted when `skip_bad_lines`.
///
/// One consumer thread may call `next`/`summary`; the destructor stops and joins the parser
/// thread promptly even when data is left unread.
class criteo_reader {
 public:
  criteo_reader(std::filesystem::path path, criteo_options options = {})
      : path_(std::move(path)), options_(std::move(options)) {
    const auto& rows = options_.table_rows;
    STRATA_EXPECTS(rows.size() == 1 || rows.size() == criteo_sparse_columns,
                   "criteo_reader: table_rows must hold 1 or 26 sizes, not ", rows.size());
    for (std::size_t f = 0; f < rows.size(); ++f)
      STRATA_EXPECTS(rows[f] > 0, "criteo_reader: table_rows[", f,
                     "] is 0; every table needs a row");
    STRATA_EXPECTS(options_.chunk_rows > 0 && options_.prefetch_chunks > 0,
                   "criteo_reader: chunk_rows and prefetch_chunks must be positive");
    STRATA_EXPECTS(options_.max_line_bytes >= 40, "criteo_reader: max_line_bytes ",
                   options_.max_line_bytes, " cannot hold a 40-field line");
    auto source = std::make_unique<detail::line_source>(path_, options_.max_line_bytes);
    worker_ = std::thread([this, src = std::move(source)]() mutable { produce(*src); });
  }
  criteo_reader(const criteo_reader&) = delete;
  criteo_reader& operator=(const criteo_reader&) = delete;
  ~criteo_reader() {
    {
      std::lock_guard lock(mutex_);
      stop_ = true;
    }
    not_full_.notify_all();
    if (worker_.joinable()) worker_.join();
  }

  /// Fills `out` with up to `batch_size` next examples; returns how many (0 at the end of the
  /// file; the last batch may be short). Rethrows the parser's error (with file:line).
  std::size_t next(ctr_batch& out, std::size_t batch_size) {
    STRATA_EXPECTS(batch_size > 0, "criteo_reader::next: batch_size must be positive");
    pending_.clear();
    while (pending_rows() < batch_size) {
      if (current_ == nullptr || offset_ == current_->size()) {
        current_ = pop();
        offset_ = 0;
        if (current_ == nullptr) break;
      }
      const std::size_t take = std::min(batch_size - pending_rows(), current_->size() - offset_);
      pending_.push_back({current_, offset_, take});
      offset_ += take;
    }
    const std::size_t n = pending_rows();
    if (n == 0) {
      out.resize(0);
      return 0;
    }
    out.resize(n);
    std::size_t row = 0;
    for (const auto& piece : pending_) {
      const auto& c = *piece.chunk;
      std::copy_n(c.dense.data() + piece.first * criteo_dense_columns,
                  piece.count * criteo_dense_columns, out.dense.row(row).data());
      std::copy_n(c.keys.data() + piece.first * criteo_sparse_columns,
                  piece.count * criteo_sparse_columns, out.keys.row(row).data());
      std::copy_n(c.labels.data() + piece.first, piece.count, out.labels.data() + row);
      row += piece.count;
    }
    pending_.clear();
    return n;
  }

  /// The next up to `batch_size` examples, or nullopt at the end of the file.
  std::optional<ctr_batch> next(std::size_t batch_size) {
    ctr_batch out;
    if (next(out, batch_size) == 0) return std::nullopt;
    return out;
  }

  /// Counts so far (the parser may be ahead of the consumer); final once `next` returned 0.
  [[nodiscard]] criteo_summary summary() const {
    std::lock_guard lock(mutex_);
    return summary_;
  }
  [[nodiscard]] const std::filesystem::path& path() const noexcept { return path_; }
  [[nodiscard]] const criteo_options& options() const noexcept { return options_; }

 private:
  using chunk_ptr = std::shared_ptr<const detail::criteo_chunk>;
  struct piece {
    chunk_ptr chunk;
    std::size_t first, count;
  };
  [[nodiscard]] std::size_t pending_rows() const noexcept {
    std::size_t n = 0;
    for (const auto& p : pending_)
      n += p.count;
    return n;
  }

  /// Next chunk from the queue, nullptr at the end; rethrows the parser's error once the
  /// chunks before it are consumed.
  chunk_ptr pop() {
    std::unique_lock lock(mutex_);
    not_empty_.wait(lock, [&] { return !queue_.empty() || done_; });
    if (!queue_.empty()) {
      chunk_ptr c = std::move(queue_.front());
      queue_.pop_front();
      lock.unlock();
      not_full_.notify_one();
      return c;
    }
    if (error_) std::rethrow_exception(error_);  // every later call raises it again
    return nullptr;
  }

  /// Parser thread body.
  void produce(detail::line_source& source) {
    try {
      criteo_summary local;
      auto chunk = std::make_shared<detail::criteo_chunk>();
      const std::size_t cap = options_.chunk_rows;
      auto reserve = [&] {
        chunk->dense.reserve(cap * criteo_dense_columns);
        chunk->keys.reserve(cap * criteo_sparse_columns);
        chunk->labels.reserve(cap);
      };
      reserve();
      std::string why;
      std::string_view line;
      bool more = true;
      while (more) {
        const auto st = source.next(line);
        std::optional<bad_line_kind> bad;
        if (st == detail::line_source::status::end) {
          more = false;
        } else {
          ++local.lines_read;
          if (st == detail::line_source::status::overlong) {
            bad = bad_line_kind::overlong;
            why = cat("line is longer than max_line_bytes = ", options_.max_line_bytes);
          } else {
            bad = detail::parse_criteo_line(line, options_.table_rows, options_.hash_seed, *chunk,
                                            why);
          }
          if (bad) {
            const std::string where = cat(path_.string(), ":", local.lines_read, ": ");
            if (!options_.skip_bad_lines) {
              local.examples += chunk->size();
              if (!push(chunk, local)) return;
              fail(errc::corrupt_data, cat(where, why, " (", to_string(*bad),
                                           "); fix the file or read with skip_bad_lines = true"));
            }
            ++local.lines_skipped;
            ++local.skipped_by_kind[static_cast<std::size_t>(*bad)];
            if (local.first_reasons.size() < options_.max_reasons)
              local.first_reasons.push_back(where + why);
          }
        }
        if (chunk->size() == cap || (!more && chunk->size() > 0)) {
          local.examples += chunk->size();
          if (!push(chunk, local)) return;
          chunk = std::make_shared<detail::criteo_chunk>();
          if (more) reserve();
        }
      }
      std::lock_guard lock(mutex_);
      local.peak_queued_chunks = summary_.peak_queued_chunks;
      summary_ = std::move(local);
      done_ = true;
    } catch (...) {
      std::lock_guard lock(mutex_);
      error_ = std::current_exception();
      done_ = true;
    }
    not_empty_.notify_all();
  }

  /// Queues `chunk` (if non-empty) and publishes `local`; false when the reader is stopping.
  bool push(const std::shared_ptr<detail::criteo_chunk>& chunk, const criteo_summary& local) {
    std::unique_lock lock(mutex_);
    not_full_.wait(lock, [&] { return stop_ || queue_.size() < options_.prefetch_chunks; });
    if (stop_) return false;
    const std::size_t peak = summary_.peak_queued_chunks;
    summary_ = local;
    if (chunk->size() > 0) queue_.push_back(chunk);
    summary_.peak_queued_chunks = std::max(peak, queue_.size());
    lock.unlock();
    not_empty_.notify_one();
    return true;
  }

  std::filesystem::path path_;
  criteo_options options_;

  mutable std::mutex mutex_;
  std::condition_variable not_empty_, not_full_;
  std::deque<chunk_ptr> queue_;  // guarded by mutex_
  criteo_summary summary_;       // guarded by mutex_
  std::exception_ptr error_;     // guarded by mutex_
  bool done_ = false;            // guarded by mutex_
  bool stop_ = false;            // guarded by mutex_

  // consumer-only state
  chunk_ptr current_;
  std::size_t offset_ = 0;
  std::vector<piece> pending_;

  std::thread worker_;  // last: started after every other member exists
};

/// Reads a whole (small) Criteo file into memory, e.g. an evaluation set. Same parsing and
/// errors as `criteo_reader`; the summary of the read is stored in `*summary` when given.
inline ctr_dataset load_criteo(const std::filesystem::path& path, criteo_options options = {},
                               criteo_summary* summary = nullptr) {
  criteo_reader reader(path, std::move(options));
  ctr_dataset out;
  ctr_batch batch;
  while (reader.next(batch, reader.options().chunk_rows) > 0)
    out.append(batch);
  if (summary != nullptr) *summary = reader.summary();
  return out;
}

}  // namespace strata::data
