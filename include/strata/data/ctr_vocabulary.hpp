/// @file ctr_vocabulary.hpp
/// Frequency thresholding of converted CTR data (MLPerf DLRM's rare-id cut-off): the keys of
/// each table seen at least `min_count` times in the training days keep a row of their own,
/// numbered 0, 1, … in key order; every other key — rare, or never seen (an eval day's new
/// ids) — shares the table's last row. Tables shrink to the frequent keys + 1 rows, and rare
/// ids learn one shared embedding instead of many barely trained ones.
///
/// A vocabulary is counted once over converted days (`strata_convert --min-count N`, which
/// calls `build_ctr_vocabulary`) and saved beside them as `vocabulary.ctrv`; every `.ctrb`
/// file of that folder — the training days and any day converted into it later, such as the
/// eval day — is then read through it (`ctr_files`), so train and eval map ids alike.
///
/// ```cpp
/// auto vocabulary = strata::data::build_ctr_vocabulary(strata::data::ctr_files("data"), 4);
/// vocabulary.save("data/vocabulary.ctrv");
/// strata::data::ctr_files days("data");   // keys now lie in [0, days.table_rows()[f])
/// ```
///
/// File layout (little-endian): magic "STRATACV", version, sparse columns, min count, hash
/// seed, examples counted, the counted files' names; per table its hashed rows and its number
/// of frequent keys; then each table's frequent keys (uint64, ascending); at the end the
/// checksum of every byte before it. Written under a temporary name and renamed when whole.
#pragma once

#include <algorithm>
#include <array>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "strata/core/checksum.hpp"
#include "strata/core/error.hpp"
#include "strata/core/key_index.hpp"
#include "strata/core/mapped_file.hpp"
#include "strata/core/rng.hpp"

namespace strata::data {

/// File name of a folder's vocabulary.
inline constexpr std::string_view ctr_vocabulary_name = "vocabulary.ctrv";

namespace detail {

/// Little-endian field writer/reader over a byte buffer (the .ctrb and .ctrv formats).
struct field_writer {
  std::vector<std::byte>& out;
  template <class T>
  void put(T value) {
    static_assert(std::endian::native == std::endian::little,
                  "strata's data formats are little-endian; a big-endian host would need swaps");
    const auto* p = reinterpret_cast<const std::byte*>(&value);
    out.insert(out.end(), p, p + sizeof(T));
  }
};
struct field_reader {
  std::span<const std::byte> in;
  std::size_t at = 0;
  template <class T>
  T get() {
    T value{};
    if (at + sizeof(T) > in.size()) return value;  // the caller checks the fields' sense
    std::memcpy(&value, in.data() + at, sizeof(T));
    at += sizeof(T);
    return value;
  }
  [[nodiscard]] std::size_t left() const noexcept { return in.size() - std::min(at, in.size()); }
};

inline constexpr std::array<char, 8> ctrv_magic = {'S', 'T', 'R', 'A', 'T', 'A', 'C', 'V'};
inline constexpr std::uint32_t ctrv_version = 1;
/// Tables of at most this many hashed rows are counted through a dense array (4 bytes per
/// hashed row); larger ones through a key_index of their keys. A vocabulary maps through a
/// dense array where that costs at most `dense_map_per_key` hashed rows per kept key (so the
/// memory a vocabulary file asks for stays within 1 KiB per key it holds), else a key_index.
inline constexpr std::uint64_t dense_map_rows = std::uint64_t{1} << 26;
inline constexpr std::uint64_t dense_map_per_key = 256;

}  // namespace detail

/// Occurrences of every key of every table, counted over converted days (before any
/// vocabulary): a saturating 32-bit count per hashed row for tables of at most 2^26 rows,
/// a key_index and a 64-bit count per distinct key above. Not thread-safe, except that
/// different tables may be counted by different threads at once.
class ctr_key_counts {
 public:
  /// Counters for tables of `hash_rows[f]` rows.
  explicit ctr_key_counts(std::vector<std::uint64_t> hash_rows) : rows_(std::move(hash_rows)) {
    STRATA_EXPECTS(!rows_.empty(), "ctr_key_counts: no table");
    tables_.resize(rows_.size());
    for (std::size_t f = 0; f < rows_.size(); ++f) {
      STRATA_EXPECTS(rows_[f] > 0, "ctr_key_counts: table ", f, " has no row");
      if (rows_[f] <= detail::dense_map_rows) tables_[f].dense.assign(rows_[f], 0);
    }
  }

  [[nodiscard]] std::size_t tables() const noexcept { return rows_.size(); }
  [[nodiscard]] std::span<const std::uint64_t> hash_rows() const noexcept { return rows_; }

  /// Counts one occurrence of `key` in table f (key < hash_rows()[f], unchecked).
  void add(std::size_t f, std::uint64_t key) {
    auto& t = tables_[f];
    if (!t.dense.empty()) {
      std::uint32_t& c = t.dense[key];
      c += c != std::numeric_limits<std::uint32_t>::max();
    } else {
      const auto [row, inserted] = t.index.find_or_insert(key);
      if (inserted) t.sparse.push_back(0);
      ++t.sparse[row];
    }
  }

  /// Occurrences of `key` in table f.
  [[nodiscard]] std::uint64_t count(std::size_t f, std::uint64_t key) const noexcept {
    const auto& t = tables_[f];
    if (!t.dense.empty()) return key < t.dense.size() ? t.dense[key] : 0;
    const auto row = t.index.find(key);
    return row == key_index::npos ? 0 : t.sparse[row];
  }

  /// The keys of table f counted at least `min_count` times, ascending.
  [[nodiscard]] std::vector<std::uint64_t> frequent(std::size_t f, std::uint64_t min_count) const {
    const auto& t = tables_[f];
    std::vector<std::uint64_t> keys;
    if (!t.dense.empty()) {
      for (std::uint64_t k = 0; k < t.dense.size(); ++k)
        if (t.dense[k] >= min_count) keys.push_back(k);
      return keys;
    }
    for (std::size_t row = 0; row < t.sparse.size(); ++row)
      if (t.sparse[row] >= min_count) keys.push_back(t.index.keys()[row]);
    std::sort(keys.begin(), keys.end());
    return keys;
  }

 private:
  struct table {
    std::vector<std::uint32_t> dense;
    key_index index;
    std::vector<std::uint64_t> sparse;
  };
  std::vector<std::uint64_t> rows_;
  std::vector<table> tables_;
};

/// One folder's frequency thresholding: per table the frequent keys (ascending) and how a key
/// maps to a row. `map` is O(1): a dense array (one load) for tables of ≤ 2^26 hashed rows
/// keeping at least one key per 256 hashed rows, a key_index (one probe) otherwise. Value type;
/// const members are safe from many threads at once.
class ctr_vocabulary {
 public:
  /// What a vocabulary was counted from, besides its keys.
  struct provenance {
    std::uint64_t min_count = 1;
    std::uint64_t hash_seed = 0;
    std::uint64_t examples = 0;              ///< examples counted
    std::vector<std::string> counted_files;  ///< the files' names
  };

  /// From counts: the keys counted at least `p.min_count` times (≥ 1) keep rows.
  ctr_vocabulary(const ctr_key_counts& counts, provenance p) : provenance_(std::move(p)) {
    STRATA_EXPECTS(provenance_.min_count >= 1, "ctr_vocabulary: min_count ", provenance_.min_count,
                   " must be at least 1 (1 keeps every key seen, 2 drops ids seen once)");
    std::vector<std::vector<std::uint64_t>> keys(counts.tables());
    for (std::size_t f = 0; f < counts.tables(); ++f)
      keys[f] = counts.frequent(f, provenance_.min_count);
    init({counts.hash_rows().begin(), counts.hash_rows().end()}, std::move(keys));
  }

  /// Reads `path` (a `vocabulary.ctrv`); a damaged or truncated file raises
  /// `errc::corrupt_data` naming it.
  static ctr_vocabulary load(const std::filesystem::path& path) {
    const mapped_file map(path,
                          "it is the vocabulary of converted data (strata_convert --min-count)");
    const auto bytes = map.bytes();
    const auto corrupt = [&](std::string_view what) {
      fail(errc::corrupt_data,
           cat("'", path.string(), "' is not a whole vocabulary: ", what,
               "; count it again (strata_convert --min-count over the training days)"));
    };
    if (bytes.size() < detail::ctrv_magic.size() + 8 ||
        std::memcmp(bytes.data(), detail::ctrv_magic.data(), detail::ctrv_magic.size()) != 0)
      corrupt("no STRATACV magic");
    std::uint64_t stored = 0;
    std::memcpy(&stored, bytes.data() + bytes.size() - 8, 8);
    if (fast_checksum(bytes.first(bytes.size() - 8)) != stored) corrupt("it fails its checksum");
    detail::field_reader r{bytes.first(bytes.size() - 8), detail::ctrv_magic.size()};
    const auto version = r.get<std::uint32_t>();
    if (version != detail::ctrv_version)
      fail(errc::unsupported, cat("'", path.string(), "' is vocabulary version ", version,
                                  "; this strata reads version ", detail::ctrv_version,
                                  ": count it again with this strata"));
    const auto tables = r.get<std::uint32_t>();
    if (tables == 0 || tables > 4096) corrupt(cat(tables, " tables"));
    provenance p;
    p.min_count = r.get<std::uint64_t>();
    p.hash_seed = r.get<std::uint64_t>();
    p.examples = r.get<std::uint64_t>();
    const auto files = r.get<std::uint32_t>();
    if (files > r.left()) corrupt("its file list runs past its end");
    for (std::uint32_t i = 0; i < files; ++i) {
      const auto length = r.get<std::uint32_t>();
      if (length > r.left()) corrupt("its file list runs past its end");
      p.counted_files.emplace_back(reinterpret_cast<const char*>(bytes.data() + r.at), length);
      r.at += length;
    }
    if (p.min_count == 0) corrupt("min count 0");
    std::vector<std::uint64_t> rows(tables), sizes(tables);
    std::uint64_t total = 0;
    for (std::uint32_t f = 0; f < tables; ++f) {
      rows[f] = r.get<std::uint64_t>();
      sizes[f] = r.get<std::uint64_t>();
      if (rows[f] == 0 || sizes[f] > rows[f]) corrupt(cat("table ", f, "'s sizes"));
      total += sizes[f];
    }
    if (total > r.left() / 8 || r.left() != total * 8)
      corrupt(cat("it should hold ", total, " keys in ", r.left(), " bytes"));
    std::vector<std::vector<std::uint64_t>> keys(tables);
    for (std::uint32_t f = 0; f < tables; ++f) {
      keys[f].resize(sizes[f]);
      if (sizes[f] > 0) std::memcpy(keys[f].data(), bytes.data() + r.at, sizes[f] * 8);
      r.at += sizes[f] * 8;
      for (std::size_t i = 0; i < keys[f].size(); ++i)
        if (keys[f][i] >= rows[f] || (i > 0 && keys[f][i] <= keys[f][i - 1]))
          corrupt(cat("table ", f, "'s keys are not ascending inside its ", rows[f], " rows"));
    }
    ctr_vocabulary v(std::move(p));
    v.init(std::move(rows), std::move(keys));
    return v;
  }

  /// Writes the vocabulary to `path` (a temporary file renamed into place).
  void save(const std::filesystem::path& path) const {
    std::vector<std::byte> out;
    detail::field_writer w{out};
    for (const char c : detail::ctrv_magic)
      w.put(c);
    w.put(detail::ctrv_version);
    w.put(static_cast<std::uint32_t>(tables_.size()));
    w.put(provenance_.min_count);
    w.put(provenance_.hash_seed);
    w.put(provenance_.examples);
    w.put(static_cast<std::uint32_t>(provenance_.counted_files.size()));
    for (const auto& name : provenance_.counted_files) {
      w.put(static_cast<std::uint32_t>(name.size()));
      const auto* p = reinterpret_cast<const std::byte*>(name.data());
      out.insert(out.end(), p, p + name.size());
    }
    for (const auto& t : tables_) {
      w.put(t.hash_rows);
      w.put(static_cast<std::uint64_t>(t.keys.size()));
    }
    for (const auto& t : tables_) {
      const auto* p = reinterpret_cast<const std::byte*>(t.keys.data());
      out.insert(out.end(), p, p + t.keys.size() * 8);
    }
    w.put(fast_checksum(out));
    auto temp = path;
    temp += ".partial";
    {
      std::ofstream file(temp, std::ios::binary | std::ios::trunc);
      file.write(reinterpret_cast<const char*>(out.data()),
                 static_cast<std::streamsize>(out.size()));
      file.flush();
      if (!file) {
        std::error_code ignored;
        std::filesystem::remove(temp, ignored);
        fail(errc::io_error, cat("cannot write the vocabulary '", temp.string(),
                                 "' (folder missing, not writable or disk full?)"));
      }
    }
    std::filesystem::rename(temp, path);
  }

  [[nodiscard]] std::size_t tables() const noexcept { return tables_.size(); }
  [[nodiscard]] const provenance& source() const noexcept { return provenance_; }
  [[nodiscard]] std::uint64_t min_count() const noexcept { return provenance_.min_count; }
  [[nodiscard]] std::uint64_t hash_seed() const noexcept { return provenance_.hash_seed; }
  /// Rows of table f before thresholding (the keys in the files lie below it).
  [[nodiscard]] std::uint64_t hash_rows(std::size_t f) const { return tables_.at(f).hash_rows; }
  /// Rows of table f after thresholding: its frequent keys + the shared rare row.
  [[nodiscard]] std::uint64_t rows(std::size_t f) const { return tables_.at(f).keys.size() + 1; }
  /// Every table's rows after thresholding.
  [[nodiscard]] std::vector<std::uint64_t> table_rows() const {
    std::vector<std::uint64_t> r;
    for (std::size_t f = 0; f < tables_.size(); ++f)
      r.push_back(rows(f));
    return r;
  }
  /// The row rare and unseen keys of table f share (its last).
  [[nodiscard]] std::uint64_t rare_row(std::size_t f) const { return tables_.at(f).keys.size(); }
  /// Table f's frequent keys, ascending (row i holds keys()[i]).
  [[nodiscard]] std::span<const std::uint64_t> frequent_keys(std::size_t f) const {
    return tables_.at(f).keys;
  }

  /// The row of hashed key `key` of table f: its rank among the frequent keys, or the rare
  /// row. f is not range-checked.
  [[nodiscard]] std::uint64_t map(std::size_t f, std::uint64_t key) const noexcept {
    const auto& t = tables_[f];
    if (!t.dense.empty()) return key < t.dense.size() ? t.dense[key] : t.keys.size();
    const auto row = t.index.find(key);
    return row == key_index::npos ? t.keys.size() : row;
  }

  /// Identifies the vocabulary (a checksum of its tables and provenance): two folders read
  /// alike iff their fingerprints agree.
  [[nodiscard]] std::uint64_t fingerprint() const noexcept { return fingerprint_; }

  /// One line: min count, rows kept and what was counted.
  [[nodiscard]] std::string describe() const {
    std::uint64_t kept = 0, hashed = 0;
    for (const auto& t : tables_) {
      kept += t.keys.size() + 1;
      hashed += t.hash_rows;
    }
    return cat("frequency threshold ", provenance_.min_count, " (counted over ",
               provenance_.counted_files.size(), " file(s), ", provenance_.examples,
               " examples): ", kept, " rows of ", hashed, " hashed ones kept");
  }

 private:
  struct table {
    std::uint64_t hash_rows = 0;
    std::vector<std::uint64_t> keys;   // frequent, ascending
    std::vector<std::uint32_t> dense;  // hashed key → row (hash_rows ≤ dense_map_rows)
    key_index index;                   // key → row otherwise
  };

  explicit ctr_vocabulary(provenance p) : provenance_(std::move(p)) {}

  void init(std::vector<std::uint64_t> rows, std::vector<std::vector<std::uint64_t>> keys) {
    tables_.resize(rows.size());
    std::uint64_t h = mix_ids(provenance_.min_count, provenance_.hash_seed);
    for (std::size_t f = 0; f < rows.size(); ++f) {
      auto& t = tables_[f];
      t.hash_rows = rows[f];
      t.keys = std::move(keys[f]);
      const auto rare = static_cast<std::uint32_t>(t.keys.size());
      if (t.hash_rows <= detail::dense_map_rows &&
          t.hash_rows <= detail::dense_map_per_key * (t.keys.size() + 1)) {
        t.dense.assign(t.hash_rows, rare);
        for (std::size_t i = 0; i < t.keys.size(); ++i)
          t.dense[t.keys[i]] = static_cast<std::uint32_t>(i);
      } else {
        t.index.reserve(t.keys.size());
        for (const auto key : t.keys)
          t.index.find_or_insert(key);  // rows in key order: row i = keys[i]
      }
      h = mix_ids(h, t.hash_rows);
      h = mix_ids(h, fast_checksum(std::as_bytes(std::span(t.keys))));
    }
    fingerprint_ = h;
  }

  provenance provenance_;
  std::vector<table> tables_;
  std::uint64_t fingerprint_ = 0;
};

}  // namespace strata::data
