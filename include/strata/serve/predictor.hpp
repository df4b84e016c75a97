/// @file predictor.hpp
/// `serve::predictor<Model>`: click probabilities from an inference bundle (serve/bundle.hpp),
/// for hashed keys or for raw Criteo TSV lines.
///
/// ```cpp
/// strata::serve::predictor<strata::models::dlrm> model("bundle");
/// std::vector<float> p(lines.size());
/// model.predict_lines(lines, p);   // "label? \t 13 integers \t 26 hex" per line
/// ```
#pragma once

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <oneapi/tbb/blocked_range.h>
#include <oneapi/tbb/parallel_for.h>

#include "strata/core/error.hpp"
#include "strata/core/mapped_file.hpp"
#include "strata/core/matrix.hpp"
#include "strata/data/batch.hpp"
#include "strata/data/criteo.hpp"
#include "strata/models/concepts.hpp"
#include "strata/nn/gemm_engine.hpp"
#include "strata/serve/bundle.hpp"

namespace strata::serve {

/// How a predictor opens a bundle and splits work.
struct predictor_options {
  /// Check every data file's checksum on open (one read of every table: O(bundle size));
  /// sizes and the manifest's fingerprint are always checked.
  bool verify_checksums = true;
  /// The library multiplying the MLPs' matrices (nn/gemm.hpp); use the one training used for
  /// bitwise-equal logits (engines agree up to float rounding).
  nn::gemm_engine gemm = nn::default_gemm_engine();
  /// Batches of at least this many samples are split into `parallel_chunk`-sample pieces run
  /// in parallel on oneTBB (0: never split). Pieces round like separate calls.
  std::size_t parallel_min_batch = 4096;
  std::size_t parallel_chunk = 1024;
};

/// A bundle's model, ready to answer: the tables memory-mapped (no copy; a table larger than
/// memory is paged in as rows are read), the dense parameters in memory.
///
/// `predict` computes, per sample, sigmoid(Model::forward(dense, rows of its keys)) with the
/// model's own forward code — the trainer's evaluation, given the same batch, bitwise (fp32
/// rows). Thread-safe: any number of threads may call predict / predict_lines at once; each
/// call borrows a scratch (a model replica and its buffers) from a pool and returns it, so
/// after warm-up (as many scratches as concurrent callers, each grown to the largest batch
/// seen) a call allocates nothing. Cost per sample: the model's forward plus one row decode
/// per table.
template <class Model>
requires bundle_model<Model> && models::ctr_model<Model>
class predictor {
 public:
  using model_type = Model;

  /// Opens bundle `dir`: parses and checks the manifest (version, fingerprint, model kind),
  /// maps every table and checks every file's size and (by default) checksum. Any mismatch
  /// raises strata::error naming the file and what to do.
  explicit predictor(const std::filesystem::path& dir, predictor_options options = {})
      : dir_(dir), options_(options), manifest_(bundle_manifest::read(dir)) {
    if (manifest_.model != model_traits<Model>::kind)
      fail(errc::invalid_argument, cat("bundle ", dir.string(), " holds a ", manifest_.model,
                                       " model, not a ", model_traits<Model>::kind,
                                       "; open it with predictor<models::", manifest_.model, ">"));
    config_ = model_traits<Model>::read(manifest_);
    config_.gemm = options_.gemm;
    const Model probe(config_);
    const auto specs = probe.tables();
    if (specs.size() != manifest_.tables.size())
      fail(errc::corrupt_data, cat("bundle ", dir.string(), ": the manifest lists ",
                                   manifest_.tables.size(), " tables but its ", manifest_.model,
                                   " config reads ", specs.size(), "; export the bundle again"));
    for (std::size_t t = 0; t < specs.size(); ++t) {
      const auto& e = manifest_.tables[t];
      if (specs[t].name != e.name || specs[t].rows != e.rows || specs[t].dim != e.dim ||
          probe.input_column(t) != e.column)
        fail(errc::corrupt_data, cat("bundle ", dir.string(), ": table ", t, " '", e.name,
                                     "' does not match its model's table '", specs[t].name,
                                     "'; export the bundle again"));
      tables_.push_back(open_file(e.file));
    }
    if (manifest_.dense_count != probe.parameters().size())
      fail(errc::corrupt_data, cat("bundle ", dir.string(), " holds ", manifest_.dense_count,
                                   " dense parameters but its model has ",
                                   probe.parameters().size(), "; export the bundle again"));
    const mapped_file dense = open_file(manifest_.dense_file);
    if (dense.bytes().size() != manifest_.dense_count * sizeof(float))
      fail(errc::corrupt_data,
           cat("bundle ", dir.string(), ": ", manifest_.dense_file, " has ", dense.bytes().size(),
               " bytes for ", manifest_.dense_count, " parameters; export the bundle again"));
    dense_.resize(manifest_.dense_count);
    if (!dense_.empty()) std::memcpy(dense_.data(), dense.bytes().data(), dense.bytes().size());
    dense_features_ = probe.dense_features();
    sparse_features_ = probe.sparse_features();
    if (manifest_.hash_rows.size() != sparse_features_)
      fail(errc::corrupt_data,
           cat("bundle ", dir.string(), ": hash.rows lists ", manifest_.hash_rows.size(),
               " sparse columns, the model reads ", sparse_features_, "; export the bundle again"));
    // Raw lines are Criteo's layout: prepared when the bundle hashes 26 columns into rows.
    if (manifest_.hash_rows.size() == data::criteo_sparse_columns &&
        std::all_of(manifest_.hash_rows.begin(), manifest_.hash_rows.end(),
                    [](std::uint64_t r) { return r > 0; }))
      hashing_.emplace(manifest_.hash_rows, manifest_.hash_seed);
    if (!manifest_.vocabulary_file.empty()) {
      (void)open_file(manifest_.vocabulary_file);  // size and checksum as the manifest lists
      vocabulary_.emplace(data::ctr_vocabulary::load(dir / manifest_.vocabulary_file));
      bool fits = vocabulary_->tables() == sparse_features_;
      for (std::size_t c = 0; fits && c < sparse_features_; ++c)
        fits = vocabulary_->hash_rows(c) == manifest_.hash_rows[c];
      for (std::size_t t = 0; fits && t < specs.size(); ++t)
        fits = vocabulary_->rows(probe.input_column(t)) == specs[t].rows;
      if (!fits)
        fail(errc::corrupt_data, cat("bundle ", dir.string(), ": its vocabulary does not map the ",
                                     "manifest's hash.rows onto its tables' rows; export the "
                                     "bundle again"));
    }
  }

  /// The vocabulary raw lines' hashed keys go through (manifest().vocabulary_file), or nullptr:
  /// keys given to predict / predict_logits are rows after it.
  [[nodiscard]] const data::ctr_vocabulary* vocabulary() const noexcept {
    return vocabulary_ ? &*vocabulary_ : nullptr;
  }

  [[nodiscard]] const bundle_manifest& manifest() const noexcept { return manifest_; }
  [[nodiscard]] const typename Model::config& model_config() const noexcept { return config_; }
  [[nodiscard]] std::size_t dense_features() const noexcept { return dense_features_; }
  [[nodiscard]] std::size_t sparse_features() const noexcept { return sparse_features_; }
  /// The dense parameters, as the bundle holds them.
  [[nodiscard]] std::span<const float> dense_parameters() const noexcept { return dense_; }
  /// Table t's encoded rows as mapped: manifest().tables[t].rows rows of row_bytes bytes in
  /// manifest().rows_precision (decode_row reads one). Valid while the predictor lives.
  [[nodiscard]] std::span<const std::byte> table_bytes(std::size_t t) const {
    STRATA_EXPECTS(t < tables_.size(), "predictor::table_bytes: table ", t, " of ", tables_.size());
    return tables_[t].bytes();
  }

  /// Logits of `batch` samples: `dense` (batch × dense_features(), transformed as in training,
  /// e.g. data::criteo_dense_value) and `keys` (batch × sparse_features(), hashed keys: key of
  /// column c < manifest().hash_rows[c]; with a vocabulary, the row it maps the hashed key to,
  /// below the table's rows) into `logits` (batch values). A key outside its table
  /// raises errc::out_of_range naming the sample, column and table.
  void predict_logits(matrix_view<const float> dense, matrix_view<const std::uint64_t> keys,
                      std::span<float> logits) const {
    check_shapes("predict_logits", dense, keys, logits.size());
    run(dense.rows(), logits, false, [&](scratch&, std::size_t first, std::size_t n) {
      return std::pair(dense.rows_slice(first, n), keys.rows_slice(first, n));
    });
  }

  /// Click probabilities sigmoid(logit) of `batch` samples (see predict_logits).
  void predict(matrix_view<const float> dense, matrix_view<const std::uint64_t> keys,
               std::span<float> probabilities) const {
    check_shapes("predict", dense, keys, probabilities.size());
    run(dense.rows(), probabilities, true, [&](scratch&, std::size_t first, std::size_t n) {
      return std::pair(dense.rows_slice(first, n), keys.rows_slice(first, n));
    });
  }

  /// Click probabilities of raw Criteo TSV lines: 40 fields (label, I1..I13, C1..C26; the
  /// label is ignored) or 39 (no label), parsed and hashed exactly as in training
  /// (data::criteo_reader with the manifest's hash.rows and hash.seed, then its vocabulary if
  /// the bundle has one). A malformed line raises
  /// errc::invalid_argument naming the line's index in the batch and the field. Needs a model
  /// with Criteo's 13 dense and 26 sparse features.
  void predict_lines(std::span<const std::string_view> lines,
                     std::span<float> probabilities) const {
    if (dense_features_ != data::criteo_dense_columns ||
        sparse_features_ != data::criteo_sparse_columns)
      fail(
          errc::unsupported,
          cat("predictor::predict_lines: the bundle's model reads ", dense_features_, " dense and ",
              sparse_features_, " sparse features, not Criteo's ", data::criteo_dense_columns,
              " and ", data::criteo_sparse_columns, "; call predict with hashed keys instead"));
    STRATA_EXPECTS(probabilities.size() == lines.size(),
                   "predictor::predict_lines: ", probabilities.size(), " outputs for ",
                   lines.size(), " lines");
    run(lines.size(), probabilities, true, [&](scratch& s, std::size_t first, std::size_t n) {
      auto& chunk = s.chunk;
      chunk.dense.clear();
      chunk.keys.clear();
      chunk.labels.clear();
      for (std::size_t i = first; i < first + n; ++i) {
        std::string_view line = lines[i];
        if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
        if (std::count(line.begin(), line.end(), '\t') ==
            static_cast<std::ptrdiff_t>(data::criteo_dense_columns + data::criteo_sparse_columns -
                                        1)) {  // no label: parse it as "0\t" + line
          s.line.assign("0\t");
          s.line.append(line);
          line = s.line;
        }
        if (!hashing_)
          fail(errc::unsupported,
               cat("predictor::predict_lines: the bundle hashes ", manifest_.hash_rows.size(),
                   " sparse columns (Criteo lines have 26, each table with rows); predict from "
                   "keys instead"));
        if (const auto bad = data::detail::parse_criteo_line(line, *hashing_, chunk, s.why))
          fail(errc::invalid_argument,
               cat("predictor::predict_lines: line ", i, " of the batch: ", s.why, " (",
                   data::to_string(*bad),
                   "); a line is [label\\t] 13 integers \\t 26 hex values, tab-separated, as in "
                   "the training data"));
        if (vocabulary_) {  // the line's keys are the chunk's last sparse_features_
          std::uint64_t* keys = chunk.keys.data() + chunk.keys.size() - sparse_features_;
          for (std::size_t c = 0; c < sparse_features_; ++c)
            keys[c] = vocabulary_->map(c, keys[c]);
        }
      }
      return std::pair(matrix_view<const float>(chunk.dense.data(), n, dense_features_),
                       matrix_view<const std::uint64_t>(chunk.keys.data(), n, sparse_features_));
    });
  }

 private:
  /// One caller's working set: a model replica (its forward keeps buffers) and the gathered
  /// rows; reused across calls.
  struct scratch {
    explicit scratch(const predictor& owner) : model(owner.config_) {
      std::copy(owner.dense_.begin(), owner.dense_.end(), model.parameters().begin());
      rows.resize(owner.tables_.size());
      views.resize(owner.tables_.size());
    }
    Model model;
    std::vector<std::vector<float>> rows;
    std::vector<matrix_view<const float>> views;
    std::vector<float> logits;
    data::detail::criteo_chunk chunk;
    std::string line, why;
  };

  /// A scratch borrowed from the pool for one piece of work, returned on scope exit.
  class lease {
   public:
    explicit lease(const predictor& owner) : owner_(owner) {
      {
        std::lock_guard lock(owner_.pool_mutex_);
        if (!owner_.pool_.empty()) {
          held_ = std::move(owner_.pool_.back());
          owner_.pool_.pop_back();
        }
      }
      if (!held_) {
        held_ = std::make_unique<scratch>(owner_);  // warm-up: one more concurrent caller
        std::lock_guard lock(owner_.pool_mutex_);
        owner_.pool_.reserve(++owner_.scratches_);  // so returning it never allocates
      }
    }
    lease(const lease&) = delete;
    lease& operator=(const lease&) = delete;
    ~lease() {
      std::lock_guard lock(owner_.pool_mutex_);
      owner_.pool_.push_back(std::move(held_));
    }
    scratch& operator*() const noexcept { return *held_; }

   private:
    const predictor& owner_;
    std::unique_ptr<scratch> held_;
  };

  [[nodiscard]] mapped_file open_file(const std::string& name) const {
    const auto& record = manifest_.file(name);
    const auto path = dir_ / name;
    mapped_file file(path, "the bundle is incomplete: copy it whole or export it again");
    if (file.size() != record.bytes)
      fail(errc::corrupt_data,
           cat("bundle file ", path.string(), " has ", file.size(), " bytes but the manifest says ",
               record.bytes, file.size() < record.bytes ? " (truncated: an interrupted copy?)" : "",
               "; copy the bundle whole or export it again"));
    if (options_.verify_checksums && bytes_checksum(file.bytes()) != record.checksum)
      fail(errc::corrupt_data,
           cat("bundle file ", (dir_ / name).string(),
               " does not match its checksum in the manifest (damaged or replaced); copy the "
               "bundle whole or export it again"));
    return file;
  }

  void check_shapes(const char* who, matrix_view<const float> dense,
                    matrix_view<const std::uint64_t> keys, std::size_t outputs) const {
    if (dense.cols() != dense_features_ || keys.cols() != sparse_features_ ||
        keys.rows() != dense.rows() || outputs != dense.rows())
      fail(errc::size_mismatch,
           cat("predictor::", who, ": dense ", dense.rows(), " x ", dense.cols(), ", keys ",
               keys.rows(), " x ", keys.cols(), ", ", outputs, " outputs; the model needs batch x ",
               dense_features_, " dense, batch x ", sparse_features_, " keys and batch outputs"));
  }

  /// Runs `inputs(scratch, first, n)` → (dense, keys) and the model on pieces of the batch,
  /// in parallel when the batch is large; writes logits or probabilities into `out`.
  template <class Inputs>
  void run(std::size_t batch, std::span<float> out, bool probabilities, Inputs&& inputs) const {
    const auto piece = [&](std::size_t first, std::size_t n) {
      const lease held(*this);
      scratch& s = *held;
      const auto [dense, keys] = inputs(s, first, n);
      forward(s, dense, keys, first, out.subspan(first, n), probabilities);
    };
    if (batch == 0) return;
    const std::size_t chunk = std::max<std::size_t>(1, options_.parallel_chunk);
    if (options_.parallel_min_batch == 0 || batch < options_.parallel_min_batch || batch <= chunk) {
      piece(0, batch);
      return;
    }
    const std::size_t pieces = (batch + chunk - 1) / chunk;
    tbb::parallel_for(tbb::blocked_range<std::size_t>(0, pieces, 1), [&](const auto& range) {
      for (std::size_t p = range.begin(); p != range.end(); ++p)
        piece(p * chunk, std::min(chunk, batch - p * chunk));
    });
  }

  void forward(scratch& s, matrix_view<const float> dense, matrix_view<const std::uint64_t> keys,
               std::size_t first, std::span<float> out, bool probabilities) const {
    const std::size_t n = dense.rows();
    for (std::size_t t = 0; t < tables_.size(); ++t) {
      const auto& e = manifest_.tables[t];
      auto& rows = s.rows[t];
      if (rows.size() < n * e.dim) rows.resize(n * e.dim);
      const std::byte* base = tables_[t].bytes().data();
      for (std::size_t i = 0; i < n; ++i) {
        const std::uint64_t key = keys(i, e.column);
        if (key >= e.rows)
          fail(errc::out_of_range,
               cat("predictor: sample ", first + i, ", sparse column ", e.column, ": key ", key,
                   " is outside table '", e.name, "' of ", e.rows,
                   " rows; hash raw values as training did (predict_lines, or data::criteo_key "
                   "with the manifest's hash.rows and hash.seed)"));
        decode_row(manifest_.rows_precision, base + key * e.row_bytes,
                   std::span<float>(rows.data() + i * e.dim, e.dim));
      }
      s.views[t] = matrix_view<const float>(rows.data(), n, e.dim);
    }
    if (s.logits.size() < n) s.logits.resize(n);
    const std::span<float> logits(s.logits.data(), n);
    s.model.forward(models::ctr_inputs{dense, s.views}, logits);
    for (std::size_t i = 0; i < n; ++i)
      out[i] = probabilities ? 1.0f / (1.0f + std::exp(-logits[i])) : logits[i];
  }

  std::filesystem::path dir_;
  predictor_options options_;
  bundle_manifest manifest_;
  std::optional<data::criteo_hashing> hashing_;     // raw lines → keys (Criteo-shaped bundles)
  std::optional<data::ctr_vocabulary> vocabulary_;  // hashed keys → rows, if the bundle has one
  typename Model::config config_;
  std::vector<mapped_file> tables_;
  std::vector<float> dense_;
  std::size_t dense_features_ = 0, sparse_features_ = 0;
  mutable std::mutex pool_mutex_;
  mutable std::vector<std::unique_ptr<scratch>> pool_;  ///< idle scratches (guarded)
  mutable std::size_t scratches_ = 0;                   ///< scratches created (guarded)
};

}  // namespace strata::serve
