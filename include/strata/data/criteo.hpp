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
#include <bit>
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
        buffer_size_(std::max<std::size_t>(1 << 20, 2 * max_line + 2)),
        // Not zero-filled: only the bytes fread stores are ever read (a fresh reader would
        // otherwise touch a whole MiB it may never use, e.g. for a small file).
        buffer_(std::make_unique_for_overwrite<char[]>(buffer_size_)) {
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
      const char* start = buffer_.get() + begin_;
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
        std::memmove(buffer_.get(), buffer_.get() + begin_, end_ - begin_);
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
    const std::size_t got = std::fread(buffer_.get() + end_, 1, buffer_size_ - end_, file_.get());
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
  std::size_t buffer_size_;
  std::unique_ptr<char[]> buffer_;
  std::size_t begin_ = 0, end_ = 0;
  bool eof_ = false;
};

/// `a % d` without a division: Lemire, Kaser & Kurz's direct remainder with a 128-bit
/// constant, exact for every 64-bit `a` and `d` > 0 ("Faster Remainder by Direct Computation",
/// 2019: with F = 2N bits, a mod d = ((ceil(2^F / d) · a) mod 2^F) · d >> F).
class fast_modulo {
  using uint128 = strata::detail::uint128;

 public:
  constexpr fast_modulo() noexcept : fast_modulo(1) {}
  explicit constexpr fast_modulo(std::uint64_t d) noexcept
      : d_(d), m_(~uint128{0} / d + 1) {}  // ceil(2^128 / d) (0 for d = 1: every a % 1 = 0)
  [[nodiscard]] constexpr std::uint64_t operator()(std::uint64_t a) const noexcept {
    const uint128 low = m_ * a;  // mod 2^128
    const uint128 bottom = static_cast<uint128>(static_cast<std::uint64_t>(low)) * d_;
    const uint128 top =
        static_cast<uint128>(static_cast<std::uint64_t>(low >> 64)) * d_ + (bottom >> 64);
    return static_cast<std::uint64_t>(top >> 64);
  }
  [[nodiscard]] constexpr std::uint64_t divisor() const noexcept { return d_; }

 private:
  std::uint64_t d_;
  uint128 m_;
};

}  // namespace detail

/// The hashing of a Criteo line's categoricals, prepared once: per feature its seeded hash
/// prefix, its table's divisor and its missing key. Keys equal `criteo_key` /
/// `criteo_missing_key` exactly. Value type; const members thread-safe.
class criteo_hashing {
 public:
  criteo_hashing(std::span<const std::uint64_t> table_rows, std::uint64_t hash_seed) {
    STRATA_EXPECTS(table_rows.size() == 1 || table_rows.size() == criteo_sparse_columns,
                   "criteo_hashing: table_rows must hold 1 or 26 sizes, not ", table_rows.size());
    for (std::size_t f = 0; f < criteo_sparse_columns; ++f) {
      const std::uint64_t rows = table_rows.size() == 1 ? table_rows[0] : table_rows[f];
      STRATA_EXPECTS(rows > 0, "criteo_hashing: table_rows[", f, "] is 0; every table needs a row");
      prefix_[f] = mix_ids(hash_seed, f + 1);
      modulo_[f] = detail::fast_modulo(rows);
      missing_[f] = criteo_missing_key(f, rows, hash_seed);
    }
  }
  /// `criteo_key(feature, value, rows of feature, seed)`.
  [[nodiscard]] std::uint64_t key(std::size_t feature, std::uint64_t value) const noexcept {
    return modulo_[feature](mix_ids(prefix_[feature], value));
  }
  [[nodiscard]] std::uint64_t missing_key(std::size_t feature) const noexcept {
    return missing_[feature];
  }

 private:
  std::array<std::uint64_t, criteo_sparse_columns> prefix_{}, missing_{};
  std::array<detail::fast_modulo, criteo_sparse_columns> modulo_{};
};

namespace detail {

inline constexpr std::size_t criteo_fields = 1 + criteo_dense_columns + criteo_sparse_columns;

/// Where a field lies in its line (left uninitialised until split_tabs writes it: no per-line
/// clearing of the array).
struct field_span {
  std::uint32_t begin, size;
};

/// Splits `line` at its tabs into `f` (the first criteo_fields fields); returns the number of
/// fields. Eight bytes at a time: a word's tab bytes are found with the has-zero-byte trick.
/// The line must be shorter than 4 GiB (readers cap it at max_line_bytes).
inline std::size_t split_tabs(std::string_view line,
                              std::array<field_span, criteo_fields>& f) noexcept {
  constexpr std::uint64_t ones = 0x0101010101010101ull, highs = 0x8080808080808080ull;
  constexpr std::uint64_t tabs = ones * '\t';
  const char* const data = line.data();
  const std::size_t size = line.size();
  std::size_t n = 0, start = 0;
  const auto field_end = [&](std::size_t at) {
    if (n < criteo_fields)
      f[n] = {static_cast<std::uint32_t>(start), static_cast<std::uint32_t>(at - start)};
    ++n;
    start = at + 1;
  };
  std::size_t i = 0;
  for (; i + 8 <= size; i += 8) {
    std::uint64_t word;
    std::memcpy(&word, data + i, 8);
    const std::uint64_t x = word ^ tabs;  // tab bytes become 0
    // Exact zero-byte mask (no false positives from borrows): high bit set where x's byte is 0.
    std::uint64_t zero = ~(((x & ~highs) + ~highs) | x | ~highs);
    while (zero != 0) {
      field_end(i + static_cast<std::size_t>(std::countr_zero(zero) / 8));
      zero &= zero - 1;
    }
  }
  for (; i < size; ++i)
    if (data[i] == '\t') field_end(i);
  field_end(size);
  return n;
}

/// 1–16 hex digits (either case) → value; false for anything else (as std::from_chars base 16
/// on an unsigned 64-bit value over the whole field).
inline bool parse_hex64(std::string_view s, std::uint64_t& value) noexcept {
  if (s.size() == 8) {  // Criteo's ids: eight digits, converted as one word
    std::uint64_t w;
    std::memcpy(&w, s.data(), 8);  // first digit in the lowest byte
    constexpr std::uint64_t ones = 0x0101010101010101ull, highs = 0x8080808080808080ull;
    // Bytes strictly between lo and hi (every byte of w below 0x80; checked by the caller's
    // mask): the bit-hack "has between" per byte, here kept for all bytes.
    const auto between = [&](std::uint64_t x, std::uint64_t lo, std::uint64_t hi) {
      return ((ones * (127 + hi) - (x & ones * 127)) & ~x &
              ((x & ones * 127) + ones * (127 - lo))) &
             highs;
    };
    const std::uint64_t lower = w | (ones * 0x20);  // 'A'-'F' → 'a'-'f'; digits keep their bit
    const std::uint64_t ok = (between(w, '0' - 1, '9' + 1) | between(lower, 'a' - 1, 'f' + 1));
    if ((w & highs) == 0 && ok == highs) {
      // Nibble per byte: digits '0'-'9' → 0-9 (low four bits), letters → low bits + 9.
      std::uint64_t v = (lower & (ones * 0x0F)) + ((lower >> 6) & ones) * 9;
      v = ((v << 4) | (v >> 8)) & 0x00FF00FF00FF00FFull;   // byte pairs, first digit high
      v = ((v << 8) | (v >> 16)) & 0x0000FFFF0000FFFFull;  // 16-bit pairs
      value = ((v << 16) | (v >> 32)) & 0xFFFFFFFFull;     // 32-bit result
      return true;
    }
    return false;
  }
  static constexpr auto digit = [] {
    std::array<std::uint8_t, 256> t{};
    t.fill(0xFF);
    for (int c = 0; c < 10; ++c)
      t['0' + c] = static_cast<std::uint8_t>(c);
    for (int c = 0; c < 6; ++c) {
      t['a' + c] = static_cast<std::uint8_t>(10 + c);
      t['A' + c] = static_cast<std::uint8_t>(10 + c);
    }
    return t;
  }();
  if (s.empty() || s.size() > 16) return false;
  std::uint64_t v = 0;
  std::uint8_t bad = 0;
  for (const char c : s) {
    const std::uint8_t d = digit[static_cast<unsigned char>(c)];
    bad |= d;  // 0xFF marks a non-digit; digits are < 16
    v = (v << 4) | (d & 0xF);
  }
  if (bad >= 16) return false;
  value = v;
  return true;
}

/// Parses one line into the end of `chunk`; on failure returns the kind and fills `why`,
/// leaving `chunk` unchanged.
inline std::optional<bad_line_kind> parse_criteo_line(std::string_view line,
                                                      const criteo_hashing& hashing,
                                                      criteo_chunk& chunk, std::string& why) {
  std::array<field_span, criteo_fields> spans;  // written by split_tabs, not cleared
  const std::size_t n = split_tabs(line, spans);
  const auto field = [&](std::size_t i) {
    return std::string_view(line.data() + spans[i].begin, spans[i].size);
  };
  if (n != criteo_fields) {
    why = cat("expected ", criteo_fields,
              " tab-separated fields (label, 13 integers, 26 hex), found ", n);
    return bad_line_kind::column_count;
  }
  const std::string_view label = field(0);
  if (label != "0" && label != "1") {
    why = cat("label '", label, "' is not 0 or 1");
    return bad_line_kind::bad_label;
  }
  std::array<float, criteo_dense_columns> dense{};
  for (std::size_t j = 0; j < criteo_dense_columns; ++j) {
    const std::string_view s = field(1 + j);
    if (s.empty()) continue;  // missing → 0
    std::int64_t x = 0;
    const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), x);
    if (ec != std::errc{} || end != s.data() + s.size()) {
      why = cat("integer column I", j + 1, " = '", s, "' is not a 64-bit decimal integer");
      return bad_line_kind::bad_integer;
    }
    dense[j] = x > 0 ? criteo_dense_value(x) : 0.0f;
  }
  std::array<std::uint64_t, criteo_sparse_columns> keys;
  for (std::size_t j = 0; j < criteo_sparse_columns; ++j) {
    const std::string_view s = field(1 + criteo_dense_columns + j);
    if (s.empty()) {
      keys[j] = hashing.missing_key(j);
      continue;
    }
    std::uint64_t v = 0;
    if (!parse_hex64(s, v)) {
      why = cat("categorical column C", j + 1, " = '", s, "' is not 1-16 hex digits");
      return bad_line_kind::bad_hex;
    }
    keys[j] = hashing.key(j, v);
  }
  chunk.dense.insert(chunk.dense.end(), dense.begin(), dense.end());
  chunk.keys.insert(chunk.keys.end(), keys.begin(), keys.end());
  chunk.labels.push_back(label == "1" ? 1.0f : 0.0f);
  return std::nullopt;
}

/// The same with the hashing given by its sizes and seed (prepares it per call: for single
/// lines; readers prepare a criteo_hashing once).
inline std::optional<bad_line_kind> parse_criteo_line(std::string_view line,
                                                      std::span<const std::uint64_t> rows,
                                                      std::uint64_t hash_seed, criteo_chunk& chunk,
                                                      std::string& why) {
  return parse_criteo_line(line, criteo_hashing(rows, hash_seed), chunk, why);
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
    hashing_.emplace(rows, options_.hash_seed);
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
            bad = detail::parse_criteo_line(line, *hashing_, *chunk, why);
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
  std::optional<criteo_hashing> hashing_;  // set before the parser thread starts

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
