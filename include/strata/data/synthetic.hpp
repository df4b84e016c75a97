/// @file synthetic.hpp
/// Synthetic Criteo-format data with a known "teacher": Zipf-distributed categorical ids,
/// heavy-tailed integer counts, some missing fields, and labels drawn from a hidden logistic
/// model. Written as a real TSV file so training reads it through `criteo_reader`.
///
/// ```cpp
/// auto report = strata::data::write_synthetic_criteo("train.tsv", {.rows = 1'000'000});
/// // report.teacher_auc is the AUC ceiling a model can reach on this file
/// ```
#pragma once

#include <oneapi/tbb/blocked_range.h>
#include <oneapi/tbb/parallel_for.h>
#include <oneapi/tbb/task_arena.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <numbers>
#include <string>
#include <vector>

#include "strata/core/error.hpp"
#include "strata/core/rng.hpp"
#include "strata/data/batch.hpp"
#include "strata/data/criteo.hpp"
#include "strata/data/metrics.hpp"

namespace strata::data {

/// Configuration of a synthetic Criteo-format dataset. Every value of row i is a pure function
/// of (seed, i), so the file is identical whatever the thread count.
struct synthetic_criteo {
  std::size_t rows = 100'000;
  std::uint64_t seed = 1;
  /// Index of the first row written: rows [first_row, first_row + rows) of the endless stream
  /// that (seed, the other settings) define — consecutive days of one teacher (its bias is
  /// calibrated on rows [0, 20000) whatever first_row; days of at least 20000 rows share it
  /// exactly).
  std::uint64_t first_row = 0;
  /// Distinct ids per categorical feature: one value for all 26 features, or 26 values.
  std::vector<std::uint64_t> distinct_ids = {10'000};
  /// Zipf exponent s of id popularity: P(rank k) ∝ k^−s.
  double zipf_exponent = 1.1;
  /// Desired fraction of positive labels (the teacher's bias is calibrated to it).
  double target_ctr = 0.25;
  /// Probability that an integer field / a categorical field is left empty.
  double dense_missing_rate = 0.05;
  double sparse_missing_rate = 0.03;
  /// Standard deviation of the teacher's per-id weights (before the per-feature factor).
  double weight_scale = 0.35;
  /// Size of the teacher's nonlinear dense term.
  double dense_scale = 0.5;
  /// Generator threads (a oneTBB arena); 0 = oneTBB's default.
  std::size_t threads = 0;
};

/// What `write_synthetic_criteo` produced.
struct synthetic_report {
  std::size_t rows = 0;
  std::size_t positives = 0;
  double positive_rate = 0;    ///< positives / rows
  double teacher_auc = 0;      ///< AUC of the teacher's probabilities on the drawn labels
  double teacher_logloss = 0;  ///< log loss of the teacher's probabilities (the floor)
  double bias = 0;             ///< calibrated teacher bias
  std::size_t bytes = 0;       ///< size of the file written
};

namespace detail {

/// Zipf(n, s) sampler over ranks 1..n by rejection-inversion (Hörmann & Derflinger 1996):
/// O(1) expected time, no table. Draws from counter_rng indices base, base + 1, … (at most 32).
class zipf_sampler {
 public:
  zipf_sampler(std::uint64_t n, double s)
      : n_(static_cast<double>(n)),
        s_(s),
        h_x1_(h_integral(1.5) - 1.0),
        h_n_(h_integral(n_ + 0.5)),
        cut_(2.0 - h_integral_inverse(h_integral(2.5) - h(2.0))) {}

  /// A rank in 1..n: the first attempt uses `first_uniform` (in [0, 1)), later ones
  /// `rng.uniform_double(base + 1 …)`.
  [[nodiscard]] std::uint64_t sample(double first_uniform, const counter_rng& rng,
                                     std::uint64_t base) const noexcept {
    double k = 1;
    for (std::uint64_t attempt = 0; attempt < 32; ++attempt) {
      const double v = attempt == 0 ? first_uniform : rng.uniform_double(base + attempt);
      const double u = h_n_ + v * (h_x1_ - h_n_);
      const double x = h_integral_inverse(u);
      k = std::clamp(std::floor(x + 0.5), 1.0, n_);
      if (k - x <= cut_ || u >= h_integral(k + 0.5) - h(k)) break;
    }
    return static_cast<std::uint64_t>(k);
  }
  [[nodiscard]] std::uint64_t sample(const counter_rng& rng, std::uint64_t base) const noexcept {
    return sample(rng.uniform_double(base), rng, base);
  }

 private:
  [[nodiscard]] double h(double x) const noexcept { return std::exp(-s_ * std::log(x)); }
  [[nodiscard]] double h_integral(double x) const noexcept {
    const double log_x = std::log(x);
    return helper2((1.0 - s_) * log_x) * log_x;
  }
  [[nodiscard]] double h_integral_inverse(double x) const noexcept {
    double t = x * (1.0 - s_);
    if (t < -1.0) t = -1.0;
    return std::exp(helper1(t) * x);
  }
  static double helper1(double x) noexcept {  // log(1 + x) / x
    return std::abs(x) > 1e-8 ? std::log1p(x) / x : 1.0 - x * (0.5 - x * (1.0 / 3.0 - 0.25 * x));
  }
  static double helper2(double x) noexcept {  // (exp(x) − 1) / x
    return std::abs(x) > 1e-8 ? std::expm1(x) / x
                              : 1.0 + x * 0.5 * (1.0 + x * (1.0 / 3.0) * (1.0 + 0.25 * x));
  }
  double n_, s_, h_x1_, h_n_, cut_;
};

/// The generator and its teacher: row i → fields and teacher logit (without bias).
class synthetic_rows {
 public:
  explicit synthetic_rows(const synthetic_criteo& cfg) : cfg_(cfg) {
    for (std::size_t f = 0; f < criteo_sparse_columns; ++f) {
      const std::uint64_t n =
          cfg.distinct_ids.size() == 1 ? cfg.distinct_ids[0] : cfg.distinct_ids[f];
      zipf_.emplace_back(n, cfg.zipf_exponent);
      const counter_rng feature_rng{cfg.seed, mix_ids(11, f)};
      importance_[f] = 0.5 + feature_rng.uniform_double(0);
      missing_weight_[f] = weight(f, std::uint64_t{1} << 40);
      // Cache the weight of every rank's id when the vocabularies are small (same values as
      // computing them on the fly, which is done otherwise).
      if (cached_ + n <= weight_cache_limit) {
        cached_ += n;
        weights_[f].resize(n + 1);
        for (std::uint64_t rank = 1; rank <= n; ++rank)
          weights_[f][rank] = weight(f, id(f, rank));
      }
    }
    for (std::size_t j = 0; j < criteo_dense_columns; ++j) {
      const counter_rng r{cfg.seed, mix_ids(12, j)};
      log_scale_[j] = 0.5 + 2.0 * r.uniform_double(0);
      dense_weight_[j] = r.normal(1) / std::sqrt(static_cast<double>(criteo_dense_columns));
    }
  }

  /// One generated row.
  struct row {
    std::array<std::int64_t, criteo_dense_columns> dense{};
    std::array<bool, criteo_dense_columns> dense_missing{};
    std::array<std::uint32_t, criteo_sparse_columns> ids{};
    std::array<bool, criteo_sparse_columns> id_missing{};
    double logit = 0;  ///< teacher logit without the bias
  };

  void make(std::uint64_t i, row& r) const noexcept {
    const std::uint64_t seed = cfg_.seed;
    std::array<double, criteo_dense_columns> z{};
    for (std::size_t j = 0; j < criteo_dense_columns; ++j) {
      const counter_rng rng{seed, mix_ids(1, j)};
      const auto b = rng.block(i);  // b[0]: missing?, b[1], b[2]: |N(0, 1)| by Box–Muller
      r.dense_missing[j] = static_cast<double>(b[0]) * 0x1.0p-32 < cfg_.dense_missing_rate;
      if (r.dense_missing[j]) continue;
      const double u1 = (static_cast<double>(b[1]) + 1.0) * 0x1.0p-32;
      const double u2 = static_cast<double>(b[2]) * 0x1.0p-32;
      const double magnitude =
          std::abs(std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2));
      std::int64_t x = static_cast<std::int64_t>(std::floor(std::expm1(log_scale_[j] * magnitude)));
      if (j == 1 && magnitude < 0.05) x = -1 - static_cast<std::int64_t>(magnitude < 0.01);
      r.dense[j] = x;
      z[j] = criteo_dense_value(x);  // exactly what the reader will compute
    }
    double dense_sum = 0;
    for (std::size_t j = 0; j < criteo_dense_columns; ++j)
      dense_sum += dense_weight_[j] * z[j];
    double logit =
        cfg_.dense_scale * (2.0 * std::tanh(0.25 * dense_sum) + std::sin(z[0]) * std::cos(z[2]));
    for (std::size_t f = 0; f < criteo_sparse_columns; ++f) {
      const counter_rng rng{seed, mix_ids(2, f)};
      const auto b = rng.block(64 * i);  // 32 bits: missing?, 64 bits: first Zipf uniform
      r.id_missing[f] = static_cast<double>(b[0]) * 0x1.0p-32 < cfg_.sparse_missing_rate;
      double w = missing_weight_[f];
      if (!r.id_missing[f]) {
        const double u =
            static_cast<double>(((std::uint64_t{b[1]} << 32) | b[2]) >> 11) * 0x1.0p-53;
        const std::uint64_t rank = zipf_[f].sample(u, rng, 64 * i);
        r.ids[f] = id(f, rank);
        w = weights_[f].empty() ? weight(f, r.ids[f]) : weights_[f][rank];
      }
      logit += w;
    }
    r.logit = logit;
  }

  /// Hex id (as written) of Zipf rank `rank` of feature f.
  [[nodiscard]] std::uint32_t id(std::size_t f, std::uint64_t rank) const noexcept {
    return static_cast<std::uint32_t>(mix_ids(mix_ids(cfg_.seed, 1000 + f), rank));
  }
  /// Teacher weight of id `id` of feature f: weight_scale · g_f · N(0, 1) keyed by (seed, f, id).
  [[nodiscard]] double weight(std::size_t f, std::uint64_t id) const noexcept {
    const counter_rng w{cfg_.seed ^ 0x7465616368657200ull, mix_ids(3, f)};  // "teacher"
    return cfg_.weight_scale * importance_[f] * w.normal(id);
  }

  /// Label of row i given its probability.
  [[nodiscard]] bool label(std::uint64_t i, double probability) const noexcept {
    return counter_rng{cfg_.seed, 4}.uniform_double(i) < probability;
  }

 private:
  synthetic_criteo cfg_;
  std::vector<zipf_sampler> zipf_;
  std::array<double, criteo_sparse_columns> importance_{};
  std::array<double, criteo_dense_columns> log_scale_{};
  std::array<double, criteo_dense_columns> dense_weight_{};
  std::array<double, criteo_sparse_columns> missing_weight_{};
  static constexpr std::uint64_t weight_cache_limit = std::uint64_t{1} << 22;
  std::uint64_t cached_ = 0;
  std::array<std::vector<float>, criteo_sparse_columns> weights_;
};

inline double sigmoid(double x) noexcept {
  return 1.0 / (1.0 + std::exp(-x));
}

inline void append_line(std::string& out, const synthetic_rows::row& r, bool label) {
  char buf[24];
  out.push_back(label ? '1' : '0');
  for (std::size_t j = 0; j < criteo_dense_columns; ++j) {
    out.push_back('\t');
    if (r.dense_missing[j]) continue;
    const auto res = std::to_chars(buf, buf + sizeof buf, r.dense[j]);
    out.append(buf, res.ptr);
  }
  static constexpr char hex[] = "0123456789abcdef";
  for (std::size_t f = 0; f < criteo_sparse_columns; ++f) {
    out.push_back('\t');
    if (r.id_missing[f]) continue;
    for (int shift = 28; shift >= 0; shift -= 4)
      out.push_back(hex[(r.ids[f] >> shift) & 0xF]);
  }
  out.push_back('\n');
}

}  // namespace detail

/// Writes `cfg.rows` lines of synthetic Criteo TSV to `path` and reports the teacher's AUC and
/// log loss on them (the ceiling a model can reach) and the positive rate.
///
/// Data: integer I_j = floor(exp(a_j·|N(0,1)|) − 1) (I2 is occasionally −1/−2, like Criteo);
/// categorical C_f = 8-hex-digit hash of a Zipf(distinct_ids[f], zipf_exponent) rank; fields
/// empty with the configured rates. Teacher: logit = bias + Σ_f weight_scale·g_f·N_(seed,f,id)
/// + dense_scale·(2·tanh(v·z / 4) + sin z_1 · cos z_3), z = log(1 + max(I, 0)) (0 if missing),
/// label ~ Bernoulli(sigmoid(logit)). The bias is calibrated by bisection on the first
/// min(rows, 20000) rows so the expected positive rate is `target_ctr`.
/// Cost: O(rows) time (parallel over a oneTBB arena), O(rows) floats of memory for the AUC;
/// about 1 s per million rows per core. Raises `errc::io_error` when the file cannot be written.
inline synthetic_report write_synthetic_criteo(const std::filesystem::path& path,
                                               const synthetic_criteo& cfg) {
  STRATA_EXPECTS(cfg.rows > 0, "synthetic_criteo: rows must be positive");
  STRATA_EXPECTS(cfg.distinct_ids.size() == 1 || cfg.distinct_ids.size() == criteo_sparse_columns,
                 "synthetic_criteo: distinct_ids must hold 1 or 26 counts, not ",
                 cfg.distinct_ids.size());
  for (auto n : cfg.distinct_ids)
    STRATA_EXPECTS(n > 0 && n <= (std::uint64_t{1} << 32), "synthetic_criteo: distinct_ids ", n,
                   " must be in [1, 2^32]");
  STRATA_EXPECTS(cfg.zipf_exponent > 0, "synthetic_criteo: zipf_exponent must be positive");
  STRATA_EXPECTS(cfg.target_ctr > 0 && cfg.target_ctr < 1,
                 "synthetic_criteo: target_ctr must be in (0, 1), not ", cfg.target_ctr);
  STRATA_EXPECTS(cfg.dense_missing_rate >= 0 && cfg.dense_missing_rate <= 1 &&
                     cfg.sparse_missing_rate >= 0 && cfg.sparse_missing_rate <= 1,
                 "synthetic_criteo: missing rates must be in [0, 1]");

  const detail::synthetic_rows gen(cfg);
  tbb::task_arena arena(cfg.threads == 0 ? tbb::task_arena::automatic
                                         : static_cast<int>(cfg.threads));

  // Calibrate the bias so that the mean probability on a prefix equals target_ctr.
  const std::size_t sample = cfg.first_row == 0 ? std::min<std::size_t>(cfg.rows, 20'000) : 20'000;
  std::vector<double> logits(sample);
  arena.execute([&] {
    tbb::parallel_for(tbb::blocked_range<std::size_t>(0, sample, 1024), [&](const auto& range) {
      detail::synthetic_rows::row r;
      for (std::size_t i = range.begin(); i != range.end(); ++i) {
        gen.make(i, r);
        logits[i] = r.logit;
      }
    });
  });
  double lo = -30, hi = 30;
  for (int it = 0; it < 60; ++it) {
    const double mid = 0.5 * (lo + hi);
    double mean = 0;
    for (double l : logits)
      mean += detail::sigmoid(l + mid);
    (mean / static_cast<double>(sample) < cfg.target_ctr ? lo : hi) = mid;
  }
  const double bias = 0.5 * (lo + hi);

  struct closer {
    void operator()(std::FILE* f) const noexcept { std::fclose(f); }
  };
  std::unique_ptr<std::FILE, closer> file(std::fopen(path.c_str(), "wb"));
  if (!file)
    fail(errc::io_error, cat("write_synthetic_criteo: cannot create '", path.string(),
                             "': ", std::strerror(errno)));

  std::vector<float> probs(cfg.rows);
  std::vector<float> labels(cfg.rows);
  constexpr std::size_t block = 2048, blocks_per_round = 32;
  std::vector<std::string> text(blocks_per_round);
  synthetic_report report;
  for (std::size_t first = 0; first < cfg.rows; first += block * blocks_per_round) {
    const std::size_t nblocks = std::min(blocks_per_round, (cfg.rows - first + block - 1) / block);
    arena.execute([&] {
      tbb::parallel_for(std::size_t{0}, nblocks, [&](std::size_t b) {
        std::string& out = text[b];
        out.clear();
        detail::synthetic_rows::row r;
        const std::size_t begin = first + b * block;
        const std::size_t end = std::min(cfg.rows, begin + block);
        for (std::size_t i = begin; i < end; ++i) {
          gen.make(cfg.first_row + i, r);
          const double p = detail::sigmoid(r.logit + bias);
          const bool y = gen.label(cfg.first_row + i, p);
          probs[i] = static_cast<float>(p);
          labels[i] = y ? 1.0f : 0.0f;
          detail::append_line(out, r, y);
        }
      });
    });
    for (std::size_t b = 0; b < nblocks; ++b) {
      if (std::fwrite(text[b].data(), 1, text[b].size(), file.get()) != text[b].size())
        fail(errc::io_error, cat("write_synthetic_criteo: writing '", path.string(),
                                 "' failed: ", std::strerror(errno), " (disk full?)"));
      report.bytes += text[b].size();
    }
  }
  if (std::fclose(file.release()) != 0)
    fail(errc::io_error, cat("write_synthetic_criteo: closing '", path.string(),
                             "' failed: ", std::strerror(errno)));

  report.rows = cfg.rows;
  for (float y : labels)
    report.positives += y == 1.0f ? 1 : 0;
  report.positive_rate = static_cast<double>(report.positives) / static_cast<double>(cfg.rows);
  report.bias = bias;
  report.teacher_logloss = logloss(probs, labels);
  if (report.positives > 0 && report.positives < cfg.rows) report.teacher_auc = auc(probs, labels);
  return report;
}

}  // namespace strata::data
