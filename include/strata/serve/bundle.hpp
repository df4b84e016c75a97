/// @file bundle.hpp
/// Inference bundles: a trained CTR model as a directory a predictor memory-maps
/// (serve::predictor), written from a training checkpoint of any strategy and world size
/// (`export_checkpoint`) or from a trainer's final state (`export_trainer`).
///
/// A bundle directory holds:
/// - `manifest.txt`: format version, model kind and shape, the feature hashing spec (rows per
///   sparse column, hash seed, the missing-value key of each column: raw Criteo TSV lines map
///   to the keys training used), one `table` line per embedding table (name rows dim column
///   file row_bytes), one `file` line per data file (name bytes checksum) and, last, a
///   `fingerprint` = checksum of every line before it.
/// - `dense.f32`: the model's flat dense parameters (little-endian fp32, the model's order).
/// - `vocabulary.ctrv` (only when training read converted data through a frequency-threshold
///   vocabulary, data/ctr_vocabulary.hpp; manifest line `hash.vocabulary`): hashed keys map
///   through it to table rows, as in training.
/// - `table-NNN.<precision>`: table NNN as one contiguous row-major file, row r at byte
///   r·row_bytes; every row of the table is there — rows training never touched hold exactly
///   what the trainer's row initialiser gives them (core/row_init.hpp).
///
/// Row encodings (`precision`): fp32 (4·dim bytes), fp16 (2·dim, IEEE binary16, round to
/// nearest even) and int8 (FBGEMM's fused 8-bit row-wise layout: dim uint8 values, then fp32
/// scale and fp32 bias; value = q·scale + bias, scale = (max − min)/255, bias = min).
#pragma once

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <sstream>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <oneapi/tbb/blocked_range.h>
#include <oneapi/tbb/parallel_for.h>

#include "strata/compress/fp16.hpp"
#include "strata/core/error.hpp"
#include "strata/core/mapped_file.hpp"
#include "strata/core/row_init.hpp"
#include "strata/core/table_spec.hpp"
#include "strata/data/criteo.hpp"
#include "strata/data/ctr_vocabulary.hpp"
#include "strata/models/dlrm.hpp"
#include "strata/models/wide_deep.hpp"
#include "strata/train/checkpoint.hpp"
#include "strata/train/checkpoint_dir.hpp"
#include "strata/train/checkpoint_rows.hpp"

namespace strata::serve {

/// The bundle format this strata writes and reads.
inline constexpr int bundle_version = 1;
/// First word of a manifest.
inline constexpr std::string_view manifest_magic = "strata-bundle";

// ---- row encodings ------------------------------------------------------------------------

/// How embedding rows are stored in a bundle (chosen at export).
enum class precision { fp32, fp16, int8 };

constexpr std::string_view to_string(precision p) noexcept {
  switch (p) {
    case precision::fp32:
      return "fp32";
    case precision::fp16:
      return "fp16";
    case precision::int8:
      return "int8";
  }
  return "?";
}

/// "fp32" | "fp16" | "int8" → the precision; nullopt for anything else.
inline std::optional<precision> parse_precision(std::string_view name) noexcept {
  for (precision p : {precision::fp32, precision::fp16, precision::int8})
    if (name == to_string(p)) return p;
  return std::nullopt;
}

/// Bytes of one encoded row of `dim` values.
constexpr std::size_t row_bytes(precision p, std::size_t dim) noexcept {
  switch (p) {
    case precision::fp32:
      return 4 * dim;
    case precision::fp16:
      return 2 * dim;
    case precision::int8:
      return dim + 8;  // dim uint8, fp32 scale, fp32 bias (FBGEMM's fused row-wise layout)
  }
  return 0;
}

/// Encodes `row` into `out` (row_bytes(p, row.size()) bytes). Pure function.
inline void encode_row(precision p, std::span<const float> row, std::span<std::byte> out) noexcept {
  const std::size_t dim = row.size();
  switch (p) {
    case precision::fp32:
      std::memcpy(out.data(), row.data(), 4 * dim);
      return;
    case precision::fp16:
      for (std::size_t c = 0; c < dim; ++c) {
        const std::uint16_t h = compress::float_to_half(row[c]);
        std::memcpy(out.data() + 2 * c, &h, 2);
      }
      return;
    case precision::int8: {
      float lo = dim == 0 ? 0.0f : row[0], hi = lo;
      for (float v : row) {
        lo = std::min(lo, v);
        hi = std::max(hi, v);
      }
      const float scale = (hi - lo) / 255.0f;
      for (std::size_t c = 0; c < dim; ++c) {
        const float q = scale > 0.0f ? std::nearbyint((row[c] - lo) / scale) : 0.0f;
        out[c] = static_cast<std::byte>(static_cast<std::uint8_t>(std::clamp(q, 0.0f, 255.0f)));
      }
      std::memcpy(out.data() + dim, &scale, 4);
      std::memcpy(out.data() + dim + 4, &lo, 4);
      return;
    }
  }
}

/// Decodes one encoded row (`in`: row_bytes(p, out.size()) bytes) into `out`. Pure function.
inline void decode_row(precision p, const std::byte* in, std::span<float> out) noexcept {
  const std::size_t dim = out.size();
  switch (p) {
    case precision::fp32:
      std::memcpy(out.data(), in, 4 * dim);
      return;
    case precision::fp16:
      for (std::size_t c = 0; c < dim; ++c) {
        std::uint16_t h;
        std::memcpy(&h, in + 2 * c, 2);
        out[c] = compress::half_to_float(h);
      }
      return;
    case precision::int8: {
      float scale, bias;
      std::memcpy(&scale, in + dim, 4);
      std::memcpy(&bias, in + dim + 4, 4);
      for (std::size_t c = 0; c < dim; ++c)
        out[c] = static_cast<float>(std::to_integer<std::uint8_t>(in[c])) * scale + bias;
      return;
    }
  }
}

// ---- the manifest -------------------------------------------------------------------------

/// One embedding table of a bundle.
struct bundle_table {
  std::string name;
  std::uint64_t rows = 0;
  std::size_t dim = 0;
  std::size_t column = 0;  ///< the sparse input column whose keys index it
  std::string file;
  std::size_t row_bytes = 0;
};

/// One data file of a bundle, as the manifest records it.
struct bundle_file {
  std::string name;
  std::uint64_t bytes = 0;
  std::uint64_t checksum = 0;
};

/// A bundle's manifest (`manifest.txt`), parsed. `config` holds the model's shape as
/// "config.<field>" → values; model_traits<Model> turns it into the model's config.
struct bundle_manifest {
  int version = bundle_version;
  std::string model;  ///< "dlrm" | "wide_deep"
  precision rows_precision = precision::fp32;
  std::uint64_t step = 0;
  std::string strategy;  ///< the strategy that trained it (informational)
  std::uint64_t seed = 0;
  std::map<std::string, std::vector<std::uint64_t>> config;
  std::uint64_t hash_seed = 0;
  std::vector<std::uint64_t> hash_rows;     ///< rows of the tables reading sparse column c
  std::vector<std::uint64_t> missing_keys;  ///< key of an empty field of sparse column c
  /// The frequency-thresholding vocabulary (data/ctr_vocabulary.hpp) hashed keys go through
  /// to become table rows (a file of the bundle), or empty: the hashed key is the row.
  std::string vocabulary_file;
  std::string dense_file;
  std::uint64_t dense_count = 0;
  std::vector<bundle_table> tables;
  std::vector<bundle_file> files;
  std::uint64_t fingerprint = 0;

  /// The manifest's text (fingerprint line included, computed over the lines before it).
  [[nodiscard]] std::string to_text() const {
    std::ostringstream out;
    out << manifest_magic << ' ' << version << '\n';
    out << "model " << model << '\n';
    out << "precision " << to_string(rows_precision) << '\n';
    out << "step " << step << '\n';
    std::string name = strategy.empty() ? std::string("-") : strategy;
    std::replace(name.begin(), name.end(), ' ', '_');
    out << "strategy " << name << '\n';
    out << "seed " << seed << '\n';
    for (const auto& [key, values] : config) {
      out << "config." << key;
      for (auto v : values)
        out << ' ' << v;
      out << '\n';
    }
    out << "hash.seed " << hash_seed << '\n';
    out << "hash.rows";
    for (auto v : hash_rows)
      out << ' ' << v;
    out << "\nhash.missing_keys";
    for (auto v : missing_keys)
      out << ' ' << v;
    if (!vocabulary_file.empty()) out << "\nhash.vocabulary " << vocabulary_file;
    out << "\ndense " << dense_file << ' ' << dense_count << '\n';
    for (std::size_t t = 0; t < tables.size(); ++t) {
      const auto& e = tables[t];
      out << "table " << t << ' ' << e.name << ' ' << e.rows << ' ' << e.dim << ' ' << e.column
          << ' ' << e.file << ' ' << e.row_bytes << '\n';
    }
    for (const auto& f : files)
      out << "file " << f.name << ' ' << f.bytes << ' ' << hex(f.checksum) << '\n';
    std::string body = out.str();
    return body + "fingerprint " + hex(text_checksum(body)) + "\n";
  }

  /// Parses `manifest.txt` of bundle `dir`; a missing, damaged or foreign manifest raises
  /// errc::io_error / errc::corrupt_data naming the file, the line and what to do.
  [[nodiscard]] static bundle_manifest read(const std::filesystem::path& dir) {
    const auto path = dir / "manifest.txt";
    std::ifstream in(path, std::ios::binary);
    if (!in)
      fail(errc::io_error, cat("bundle ", dir.string(), ": cannot open ", path.string(),
                               " (is this an inference bundle? write one with strata_export or "
                               "ctr_train --export)"));
    std::ostringstream whole;
    whole << in.rdbuf();
    const std::string text = whole.str();
    bundle_manifest m;
    std::size_t line_no = 0, at = 0;
    bool fingerprinted = false;
    const auto bad = [&](const std::string& what) {
      fail(errc::corrupt_data, cat("bundle manifest ", path.string(), ":", line_no, ": ", what,
                                   "; the bundle is damaged or was edited: export it again"));
    };
    while (at < text.size()) {
      const std::size_t end = std::min(text.find('\n', at), text.size());
      const std::string line = text.substr(at, end - at);
      const std::size_t line_start = at;
      at = end + 1;
      ++line_no;
      if (line.empty()) continue;
      if (fingerprinted) bad("text after the fingerprint line");
      std::istringstream words(line);
      std::string key;
      words >> key;
      const auto u64 = [&](const char* what) {
        std::string word;
        if (!(words >> word)) bad(cat("'", key, "' lacks its ", what));
        std::uint64_t v = 0;
        const auto [p, ec] = std::from_chars(word.data(), word.data() + word.size(), v);
        if (ec != std::errc{} || p != word.data() + word.size())
          bad(cat("'", key, "': ", what, " '", word, "' is not an unsigned integer"));
        return v;
      };
      const auto word = [&](const char* what) {
        std::string w;
        if (!(words >> w)) bad(cat("'", key, "' lacks its ", what));
        return w;
      };
      const auto rest_u64 = [&] {
        std::vector<std::uint64_t> values;
        std::string w;
        while (words >> w) {
          std::uint64_t v = 0;
          const auto [p, ec] = std::from_chars(w.data(), w.data() + w.size(), v);
          if (ec != std::errc{} || p != w.data() + w.size())
            bad(cat("'", key, "': '", w, "' is not an unsigned integer"));
          values.push_back(v);
        }
        return values;
      };
      if (line_no == 1) {
        if (key != manifest_magic)
          bad(cat("not a strata bundle manifest (first word '", key, "')"));
        const auto version = u64("format version");
        if (version != static_cast<std::uint64_t>(bundle_version))
          fail(errc::unsupported,
               cat("bundle ", dir.string(), " is in format version ", version,
                   " but this strata reads version ", bundle_version,
                   ": export it again with this strata's strata_export (or ctr_train --export)"));
        continue;
      }
      if (key == "model") {
        m.model = word("kind");
      } else if (key == "precision") {
        const auto name = word("name");
        const auto p = parse_precision(name);
        if (!p) bad(cat("precision '", name, "' is not fp32, fp16 or int8"));
        m.rows_precision = *p;
      } else if (key == "step") {
        m.step = u64("step");
      } else if (key == "strategy") {
        m.strategy = word("name");
      } else if (key == "seed") {
        m.seed = u64("seed");
      } else if (key.rfind("config.", 0) == 0) {
        m.config[key.substr(7)] = rest_u64();
      } else if (key == "hash.seed") {
        m.hash_seed = u64("seed");
      } else if (key == "hash.rows") {
        m.hash_rows = rest_u64();
      } else if (key == "hash.missing_keys") {
        m.missing_keys = rest_u64();
      } else if (key == "hash.vocabulary") {
        m.vocabulary_file = word("file");
      } else if (key == "dense") {
        m.dense_file = word("file");
        m.dense_count = u64("count");
      } else if (key == "table") {
        const auto index = u64("index");
        if (index != m.tables.size()) bad(cat("table ", index, " out of order"));
        bundle_table e;
        e.name = word("name");
        e.rows = u64("rows");
        e.dim = static_cast<std::size_t>(u64("dim"));
        e.column = static_cast<std::size_t>(u64("column"));
        e.file = word("file");
        e.row_bytes = static_cast<std::size_t>(u64("row bytes"));
        m.tables.push_back(std::move(e));
      } else if (key == "file") {
        bundle_file f;
        f.name = word("name");
        f.bytes = u64("size");
        const auto sum = word("checksum");
        const auto [p, ec] = std::from_chars(sum.data(), sum.data() + sum.size(), f.checksum, 16);
        if (ec != std::errc{} || p != sum.data() + sum.size())
          bad(cat("checksum '", sum, "' is not hexadecimal"));
        m.files.push_back(std::move(f));
      } else if (key == "fingerprint") {
        const auto sum = word("value");
        const auto [p, ec] =
            std::from_chars(sum.data(), sum.data() + sum.size(), m.fingerprint, 16);
        if (ec != std::errc{} || p != sum.data() + sum.size())
          bad(cat("fingerprint '", sum, "' is not hexadecimal"));
        if (m.fingerprint != text_checksum(std::string_view(text).substr(0, line_start)))
          bad("the fingerprint does not match the lines above it (the manifest was changed)");
        fingerprinted = true;
      } else {
        bad(cat("unknown field '", key, "'"));
      }
    }
    if (line_no == 0) bad("the manifest is empty");
    if (!fingerprinted) bad("no fingerprint line (the manifest is truncated)");
    if (m.model.empty() || m.dense_file.empty() || m.tables.empty())
      bad("the model, dense or table lines are missing");
    for (const auto& e : m.tables) {
      if (e.rows == 0 || e.dim == 0) bad(cat("table '", e.name, "' has no rows or no values"));
      if (e.row_bytes != row_bytes(m.rows_precision, e.dim))
        bad(cat("table '", e.name, "' has rows of ", e.row_bytes, " bytes but ", e.dim, " ",
                to_string(m.rows_precision), " values take ", row_bytes(m.rows_precision, e.dim)));
      if (e.column >= m.hash_rows.size())
        bad(cat("table '", e.name, "' reads sparse column ", e.column, " but hash.rows lists ",
                m.hash_rows.size()));
    }
    return m;
  }

  /// The manifest's record of data file `name` (errc::corrupt_data if it lists none).
  [[nodiscard]] const bundle_file& file(const std::string& name) const {
    for (const auto& f : files)
      if (f.name == name) return f;
    fail(errc::corrupt_data,
         cat("bundle manifest lists no size and checksum for ", name, "; export the bundle again"));
  }

  /// 16 hex digits.
  [[nodiscard]] static std::string hex(std::uint64_t v) { return hex16(v); }
  [[nodiscard]] static std::uint64_t text_checksum(std::string_view text) {
    train::detail::checksum64 sum;
    sum.update(std::as_bytes(std::span(text.data(), text.size())));
    return sum.value();
  }
};

/// Checksum of a data file's bytes (train::detail::checksum64, as checkpoints use).
inline std::uint64_t bytes_checksum(std::span<const std::byte> bytes) {
  train::detail::checksum64 sum;
  sum.update(bytes);
  return sum.value();
}

// ---- the models a bundle can hold ----------------------------------------------------------

/// What a bundle records of a model type: its kind and its config as manifest fields.
template <class Model>
struct model_traits;

namespace detail {
inline std::vector<std::uint64_t> widen(const std::vector<std::size_t>& v) {
  return {v.begin(), v.end()};
}
inline const std::vector<std::uint64_t>& field(const bundle_manifest& m, const std::string& key,
                                               std::size_t min_values = 1) {
  const auto found = m.config.find(key);
  if (found == m.config.end() || found->second.size() < min_values)
    fail(errc::corrupt_data, cat("bundle manifest: the ", m.model, " model's config.", key,
                                 " is missing; export the bundle again"));
  return found->second;
}
inline std::vector<std::size_t> narrow(const std::vector<std::uint64_t>& v) {
  return {v.begin(), v.end()};
}
/// Per-table row counts of the manifest's tables [first, first + count).
inline std::vector<std::uint64_t> rows_of(const bundle_manifest& m, std::size_t first,
                                          std::size_t count) {
  std::vector<std::uint64_t> rows;
  for (std::size_t t = first; t < first + count && t < m.tables.size(); ++t)
    rows.push_back(m.tables[t].rows);
  return rows;
}
}  // namespace detail

template <>
struct model_traits<models::dlrm> {
  static constexpr std::string_view kind = "dlrm";
  static void write(const models::dlrm::config& c, bundle_manifest& m) {
    m.config["dense_features"] = {c.dense_features};
    m.config["sparse_features"] = {c.sparse_features};
    m.config["embedding_dim"] = {c.embedding_dim};
    m.config["bottom_mlp"] = detail::widen(c.bottom_mlp);
    m.config["top_mlp"] = detail::widen(c.top_mlp);
  }
  static models::dlrm::config read(const bundle_manifest& m) {
    models::dlrm::config c;
    c.dense_features = detail::field(m, "dense_features")[0];
    c.sparse_features = detail::field(m, "sparse_features")[0];
    c.embedding_dim = detail::field(m, "embedding_dim")[0];
    c.bottom_mlp = detail::narrow(detail::field(m, "bottom_mlp"));
    c.top_mlp = detail::narrow(detail::field(m, "top_mlp"));
    c.table_rows = detail::rows_of(m, 0, c.sparse_features);
    c.seed = m.seed;
    return c;
  }
};

template <>
struct model_traits<models::wide_deep> {
  static constexpr std::string_view kind = "wide_deep";
  static void write(const models::wide_deep::config& c, bundle_manifest& m) {
    m.config["dense_features"] = {c.dense_features};
    m.config["sparse_features"] = {c.sparse_features};
    m.config["deep_dim"] = {c.deep_dim};
    m.config["deep_mlp"] = detail::widen(c.deep_mlp);
  }
  static models::wide_deep::config read(const bundle_manifest& m) {
    models::wide_deep::config c;
    c.dense_features = detail::field(m, "dense_features")[0];
    c.sparse_features = detail::field(m, "sparse_features")[0];
    c.deep_dim = detail::field(m, "deep_dim")[0];
    c.deep_mlp = detail::narrow(detail::field(m, "deep_mlp"));
    c.table_rows = detail::rows_of(m, 0, c.sparse_features);  // wide tables come first
    c.seed = m.seed;
    return c;
  }
};

/// A model type a bundle can hold.
template <class Model>
concept bundle_model = requires(const typename Model::config& c, bundle_manifest& m) {
  { model_traits<Model>::kind } -> std::convertible_to<std::string_view>;
  model_traits<Model>::write(c, m);
  { model_traits<Model>::read(std::as_const(m)) } -> std::same_as<typename Model::config>;
};

/// The row initialiser a trainer of `Model` with this seed and `embedding_init_scale` uses
/// (`uniform_init::for_training`, the function train::trainer::init calls) — what untouched
/// rows hold.
template <class Model>
uniform_init training_init(const Model& model, std::uint64_t seed, float embedding_init_scale) {
  std::vector<std::uint64_t> rows;
  std::vector<bool> zero_tables;
  for (const auto& spec : model.tables())
    rows.push_back(spec.rows);
  if constexpr (requires { model.zero_initialised(std::size_t{}); })
    for (std::size_t t = 0; t < rows.size(); ++t)
      zero_tables.push_back(model.zero_initialised(t));
  return uniform_init::for_training(seed, embedding_init_scale, rows, zero_tables);
}

// ---- writing a bundle ----------------------------------------------------------------------

/// How a bundle is written.
struct export_options {
  precision rows = precision::fp32;  ///< encoding of the embedding rows
  /// Seed of the feature hashing (data::criteo_options::hash_seed); default: the run's seed,
  /// as ctr_train reads its data.
  std::optional<std::uint64_t> hash_seed{};
  /// The run's trainer_options::embedding_init_scale (0: DLRM's per-table default).
  float embedding_init_scale = 0.0f;
  bool overwrite = false;  ///< replace an existing bundle directory
  /// The vocabulary the run's keys were read through (`vocabulary.ctrv` beside converted
  /// data, data/ctr_vocabulary.hpp), if any: copied into the bundle, so raw lines are hashed
  /// into its hashed rows and mapped to table rows as in training. Its seed is the hashing's.
  std::optional<std::filesystem::path> vocabulary{};
};

/// What an export wrote.
struct export_report {
  std::filesystem::path dir;
  std::uint64_t step = 0;
  std::size_t rows_written = 0;      ///< rows taken from the checkpoint / trainer
  std::size_t rows_initialised = 0;  ///< rows never touched in training (initial values)
  std::uint64_t bytes = 0;           ///< every data file together
  std::uint64_t fingerprint = 0;
};

namespace detail {

/// A file created at a fixed size and mapped writable (RAII: unmapped and closed on scope exit).
/// `who` starts its error messages ("bundle export").
class writable_map {
 public:
  writable_map(const std::filesystem::path& path, std::size_t bytes,
               std::string_view who = "bundle export")
      : path_(path), who_(who), bytes_(bytes) {
    fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd_ < 0 || ::ftruncate(fd_, static_cast<off_t>(bytes)) != 0) {
      const int err = errno;
      if (fd_ >= 0) ::close(fd_);
      fail(errc::io_error, cat(who, ": cannot create ", path.string(), " of ", bytes, " bytes (",
                               std::strerror(err), "); is the disk full?"));
    }
    if (bytes > 0) {
      void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd_, 0);
      if (p == MAP_FAILED) {
        const int err = errno;
        ::close(fd_);
        fail(errc::io_error, cat(who, ": cannot map ", path.string(), ": ", std::strerror(err)));
      }
      data_ = static_cast<std::byte*>(p);
    }
  }
  writable_map(const writable_map&) = delete;
  writable_map& operator=(const writable_map&) = delete;
  ~writable_map() {
    if (data_ != nullptr) ::munmap(data_, bytes_);
    if (fd_ >= 0) ::close(fd_);
  }
  [[nodiscard]] std::span<std::byte> bytes() const noexcept { return {data_, bytes_}; }
  /// Flushes to disk; raises errc::io_error on failure.
  void sync() const {
    if ((data_ != nullptr && ::msync(data_, bytes_, MS_SYNC) != 0) || ::fsync(fd_) != 0)
      fail(errc::io_error,
           cat(who_, ": writing ", path_.string(), " failed: ", std::strerror(errno)));
  }

 private:
  std::filesystem::path path_;
  std::string who_;
  std::size_t bytes_ = 0;
  int fd_ = -1;
  std::byte* data_ = nullptr;
};

/// Where the rows of a bundle come from: `dense` (the flat dense parameters) and
/// visit(fn(table, key, row)) over every row training holds. Type-erased callbacks, so one
/// write_bundle per model serves every trainer composition (templated on the visitor it was
/// compiled once per composition: 151 KB of ctr_train_dlrm.o's 2.98 MB of code).
using row_sink = std::function<void(std::size_t, std::uint64_t, std::span<const float>)>;
using row_visitor = std::function<void(const row_sink&)>;
template <class Model>
export_report write_bundle(const Model& model, const typename Model::config& config,
                           std::span<const float> dense, const row_visitor& visit,
                           std::uint64_t seed, std::uint64_t step, const std::string& strategy,
                           const std::filesystem::path& out, const export_options& options) {
  namespace fs = std::filesystem;
  using traits = model_traits<Model>;
  const auto tables = model.tables();
  STRATA_EXPECTS(dense.size() == model.parameters().size(), "bundle export: ", dense.size(),
                 " dense parameters for a model of ", model.parameters().size());
  for (std::size_t t = 0; t < tables.size(); ++t) {
    if (tables[t].rows == 0)
      fail(errc::unsupported,
           cat("bundle export: table '", tables[t].name,
               "' has no fixed row count (hash-table storage); a bundle stores each table as one "
               "contiguous file, so give the model table_rows"));
    STRATA_EXPECTS(tables[t].name.find_first_of(" \t\n") == std::string::npos,
                   "bundle export: table name '", tables[t].name, "' holds white space");
  }
  if (fs::exists(out) && !fs::is_empty(out) && !options.overwrite)
    fail(errc::invalid_argument,
         cat("bundle export: ", out.string(),
             " already exists and is not empty; choose a new directory or remove it first"));
  const fs::path staging = out.string() + ".tmp";
  std::error_code ec;
  fs::remove_all(staging, ec);
  fs::create_directories(staging, ec);
  if (ec)
    fail(errc::io_error, cat("bundle export: cannot create ", staging.string(), " (", ec.message(),
                             "); choose a directory you can write"));

  bundle_manifest m;
  m.model = std::string(traits::kind);
  m.rows_precision = options.rows;
  m.step = step;
  m.strategy = strategy;
  m.seed = seed;
  traits::write(config, m);
  m.hash_seed = options.hash_seed.value_or(seed);
  const std::size_t columns = model.sparse_features();
  m.hash_rows.assign(columns, 0);
  for (std::size_t t = 0; t < tables.size(); ++t) {
    const std::size_t c = model.input_column(t);
    if (m.hash_rows[c] == 0) m.hash_rows[c] = tables[t].rows;
    STRATA_EXPECTS(m.hash_rows[c] == tables[t].rows, "bundle export: tables reading sparse column ",
                   c, " have different row counts (", m.hash_rows[c], " and ", tables[t].rows,
                   "): one hash cannot index both");
  }
  if (options.vocabulary) {  // hashed keys → the vocabulary → table rows
    const auto v = data::ctr_vocabulary::load(*options.vocabulary);
    STRATA_EXPECTS(v.tables() == columns, "bundle export: the vocabulary ",
                   options.vocabulary->string(), " has ", v.tables(),
                   " tables but the model reads ", columns, " sparse columns");
    STRATA_EXPECTS(!options.hash_seed || *options.hash_seed == v.hash_seed(),
                   "bundle export: hash seed ", options.hash_seed.value_or(0),
                   " but the vocabulary was counted over keys hashed with seed ", v.hash_seed(),
                   "; drop the seed (the vocabulary's is used)");
    m.hash_seed = v.hash_seed();
    for (std::size_t c = 0; c < columns; ++c) {
      STRATA_EXPECTS(v.rows(c) == m.hash_rows[c], "bundle export: the vocabulary ",
                     options.vocabulary->string(), " maps sparse column ", c, " into ", v.rows(c),
                     " rows but the model's table has ", m.hash_rows[c],
                     "; give the vocabulary the run read its data through");
      m.hash_rows[c] = v.hash_rows(c);
    }
    m.vocabulary_file = std::string(data::ctr_vocabulary_name);
    fs::copy_file(*options.vocabulary, staging / m.vocabulary_file,
                  fs::copy_options::overwrite_existing);
    const mapped_file copy(staging / m.vocabulary_file);
    m.files.push_back({m.vocabulary_file, copy.bytes().size(), bytes_checksum(copy.bytes())});
  }
  for (std::size_t c = 0; c < columns; ++c)
    m.missing_keys.push_back(data::criteo_missing_key(c, m.hash_rows[c], m.hash_seed));

  export_report report;
  report.step = step;
  // Every table: initial values everywhere, then the rows training holds.
  const auto init = training_init(model, seed, options.embedding_init_scale);
  std::vector<std::unique_ptr<writable_map>> maps;
  std::vector<std::vector<bool>> touched(tables.size());
  for (std::size_t t = 0; t < tables.size(); ++t) {
    bundle_table e;
    e.name = tables[t].name;
    e.rows = tables[t].rows;
    e.dim = tables[t].dim;
    e.column = model.input_column(t);
    e.file = cat("table-", t < 10 ? "00" : t < 100 ? "0" : "", t, ".", to_string(options.rows));
    e.row_bytes = row_bytes(options.rows, e.dim);
    maps.push_back(std::make_unique<writable_map>(staging / e.file, e.rows * e.row_bytes));
    touched[t].assign(e.rows, false);
    m.tables.push_back(e);
  }
  visit([&](std::size_t t, std::uint64_t key, std::span<const float> row) {
    STRATA_EXPECTS(t < tables.size(), "bundle export: row of table ", t, " but the model has ",
                   tables.size(), " tables");
    const auto& e = m.tables[t];
    if (key >= e.rows || row.size() != e.dim)
      fail(errc::corrupt_data, cat("bundle export: a row of table '", e.name, "' has key ", key,
                                   " and ", row.size(), " values, outside the table's ", e.rows,
                                   " rows of ", e.dim, " (written for another model?)"));
    encode_row(options.rows, row, maps[t]->bytes().subspan(key * e.row_bytes, e.row_bytes));
    if (!touched[t][key]) ++report.rows_written;
    touched[t][key] = true;
  });
  for (std::size_t t = 0; t < tables.size(); ++t) {
    const auto& e = m.tables[t];
    const auto bytes = maps[t]->bytes();
    tbb::parallel_for(tbb::blocked_range<std::uint64_t>(0, e.rows, 4096), [&](const auto& range) {
      std::vector<float> fresh(e.dim);
      for (std::uint64_t r = range.begin(); r != range.end(); ++r)
        if (!touched[t][r]) {
          init.fill(t, r, fresh);
          encode_row(options.rows, fresh, bytes.subspan(r * e.row_bytes, e.row_bytes));
        }
    });
    report.rows_initialised +=
        static_cast<std::size_t>(std::count(touched[t].begin(), touched[t].end(), false));
    maps[t]->sync();
    m.files.push_back({e.file, bytes.size(), bytes_checksum(bytes)});
    maps[t].reset();
  }
  // The dense parameters (after the visit: a checkpoint's rows files carry them too).
  m.dense_file = "dense.f32";
  m.dense_count = dense.size();
  {
    writable_map file(staging / m.dense_file, dense.size() * sizeof(float));
    if (!dense.empty()) std::memcpy(file.bytes().data(), dense.data(), dense.size_bytes());
    file.sync();
    m.files.push_back({m.dense_file, dense.size_bytes(), bytes_checksum(file.bytes())});
  }
  for (const auto& f : m.files)
    report.bytes += f.bytes;
  const std::string text = m.to_text();
  {
    std::ofstream manifest(staging / "manifest.txt", std::ios::binary | std::ios::trunc);
    manifest << text;
    if (!manifest.flush())
      fail(errc::io_error,
           cat("bundle export: cannot write ", (staging / "manifest.txt").string()));
  }
  if (fs::exists(out)) fs::remove_all(out);
  fs::rename(staging, out, ec);
  if (ec)
    fail(errc::io_error, cat("bundle export: cannot rename ", staging.string(), " to ",
                             out.string(), ": ", ec.message()));
  report.dir = out;
  report.fingerprint = bundle_manifest::read(out).fingerprint;
  return report;
}

}  // namespace detail

/// Writes the inference bundle `out` from training checkpoint `checkpoint` (a checkpoint
/// folder holding state.ckpt, or a checkpoint directory: its `latest` is used), written by any
/// strategy and world size, for a model of shape `config` (its tables and dense size must be
/// the checkpoint's: otherwise errc::corrupt_data says which). The bundle is staged in
/// `out.tmp` and renamed, so `out` is whole or absent. Cost: one pass over the checkpoint's
/// rows files plus the tables' size in writes and one checksum pass.
template <bundle_model Model>
export_report export_checkpoint(const std::filesystem::path& checkpoint,
                                const typename Model::config& config,
                                const std::filesystem::path& out, export_options options = {}) {
  namespace fs = std::filesystem;
  const fs::path dir = train::checkpoint_directory(checkpoint).latest();
  const auto meta = train::checkpoint_meta::read(dir / "state.ckpt");
  meta.check_complete(dir);
  auto shaped = config;
  shaped.seed = meta.seed;
  const Model model(shaped);
  const auto tables = model.tables();
  std::string fingerprint;
  for (const auto& table : tables)
    fingerprint += cat(table.name, " ", table.rows, " ", table.dim, "\n");
  if (!meta.tables.empty() && meta.tables != fingerprint)
    fail(errc::corrupt_data, cat("checkpoint ", dir.string(), " holds the tables\n", meta.tables,
                                 "but the model to export has\n", fingerprint,
                                 "(name rows dim); give the model configuration the run trained"));
  if (meta.dense_count != model.parameters().size())
    fail(errc::corrupt_data,
         cat("checkpoint ", dir.string(), " holds ", meta.dense_count, " dense parameters but the ",
             model_traits<Model>::kind, " model to export has ", model.parameters().size(),
             "; give the MLP sizes the run trained (e.g. ctr_train --tiny)"));
  // The dense parameters travel as table `tables.size()` in rows of meta.dense_row values.
  std::vector<float> dense(meta.dense_count);
  const std::size_t dense_row = meta.dense_row == 0 ? 1 : meta.dense_row;
  const std::size_t dense_rows = (dense.size() + dense_row - 1) / dense_row;
  std::vector<train::row_shape> shapes;
  for (const auto& table : tables)
    shapes.push_back({table.dim, train::row_shape::any_state});
  shapes.push_back({dense_row, train::row_shape::any_state});
  std::vector<bool> dense_seen(dense_rows, false);
  const auto visit = [&](auto&& take) {
    train::read_row_records(
        dir, shapes,
        [&](std::size_t t, std::uint64_t key, std::span<const float> row, std::span<const float>,
            const fs::path& file) {
          if (t < tables.size()) {
            take(t, key, row);
            return;
          }
          if (key >= dense_rows)
            fail(errc::corrupt_data, cat("checkpoint ", file.string(), ": dense row ", key,
                                         " outside the model's ", dense_rows, " rows"));
          const std::size_t first = key * dense_row;
          const std::size_t n = std::min(dense_row, dense.size() - first);
          std::copy_n(row.begin(), n, dense.begin() + static_cast<std::ptrdiff_t>(first));
          dense_seen[key] = true;
        });
    const auto seen = std::count(dense_seen.begin(), dense_seen.end(), true);
    if (static_cast<std::size_t>(seen) != dense_rows)
      fail(errc::corrupt_data, cat("checkpoint ", dir.string(), " holds ", seen, " of the ",
                                   dense_rows, " dense parameter rows"));
  };
  // One pass over the rows files: the tables' rows go to the bundle, the dense rows into
  // `dense`, which write_bundle writes after the visit.
  return detail::write_bundle(model, shaped, std::span<const float>(dense), visit, meta.seed,
                              meta.step, meta.strategy, out, options);
}

/// Writes the inference bundle `out` from a trainer's current state (after `fit`): its dense
/// parameters and every embedding row it holds (worker 0's replica, or the servers' rows);
/// rows it never touched get their initial values. `config` is the model configuration the
/// trainer was built with; `step` is recorded in the manifest.
template <class Trainer>
requires bundle_model<typename Trainer::model_type> export_report export_trainer(
    const Trainer& trainer, const typename Trainer::model_type::config& config,
    const std::filesystem::path& out, export_options options = {}, std::uint64_t step = 0) {
  using Model = typename Trainer::model_type;
  auto shaped = config;
  shaped.seed = trainer.options().seed;
  const Model model(shaped);
  if (options.embedding_init_scale <= 0.0f)
    options.embedding_init_scale = trainer.options().embedding_init_scale;
  const auto dense = trainer.dense_parameters();
  return detail::write_bundle(
      model, shaped, dense,
      [&](auto&& take) {
        trainer.for_each_embedding_row([&](std::size_t t, std::uint64_t key,
                                           std::span<const float> row,
                                           std::span<const float>) { take(t, key, row); });
      },
      trainer.options().seed, step, Trainer::strategy_name, out, options);
}

}  // namespace strata::serve
