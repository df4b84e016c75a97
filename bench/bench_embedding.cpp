/// @file bench_embedding.cpp
/// Pooled embedding lookup (forward) and sparse SGD update (backward) throughput of
/// strata::embedding::local on a large table with Zipf(1.05) keys, against same-run baselines:
///   (a) a plain pooled gather loop with software prefetch (forward) / a plain serial
///       scatter-SGD loop with prefetch (backward): the library's overhead, goal ratio >= 0.8;
///   (b) PyTorch nn.EmbeddingBag(mode='sum', sparse=True) + torch.optim.SGD on the same keys
///       (bench/peers/embeddingbag_torch.py, best of 1 and 2 torch threads): goal ratio >= 2.
/// rows/s = keys processed per second (one gathered or updated row per key).
/// Also reports bytes per row of hash_table vs local storage.
///
/// Usage: bench_embedding [--quick] [--json PATH] [--no-torch] [--peer path/to/script.py]
///   table 1 GiB (--quick: 64 MiB), dim 16 and 64, bag length 1 and 20, 2048 bags per batch.
#include <oneapi/tbb/blocked_range.h>
#include <oneapi/tbb/info.h>
#include <oneapi/tbb/parallel_for.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "bench_common.hpp"
#include "strata/core/rng.hpp"
#include "strata/embedding.hpp"
#include "strata/optim.hpp"

using namespace strata;
using namespace strata::embedding;

namespace {

/// Zipf(exponent) ranks in [1, n] by rejection-inversion (Hörmann & Derflinger 1996), driven by
/// counter_rng so the keys are a pure function of (seed, index).
class zipf {
 public:
  zipf(std::uint64_t n, double exponent) : n_(static_cast<double>(n)), q_(exponent) {
    h_x1_ = h_integral(1.5) - 1.0;
    h_n_ = h_integral(n_ + 0.5);
    s_ = 2.0 - h_integral_inverse(h_integral(2.5) - h(2.0));
  }
  [[nodiscard]] std::uint64_t operator()(const counter_rng& rng, std::uint64_t index) const {
    for (std::uint64_t attempt = 0;; ++attempt) {
      const double u = h_n_ + rng.uniform_double(index * 64 + attempt) * (h_x1_ - h_n_);
      const double x = h_integral_inverse(u);
      const double k = std::clamp(std::floor(x + 0.5), 1.0, n_);
      if (k - x <= s_ || u >= h_integral(k + 0.5) - h(k)) return static_cast<std::uint64_t>(k);
    }
  }

 private:
  [[nodiscard]] double h(double x) const { return std::exp(-q_ * std::log(x)); }
  [[nodiscard]] double h_integral(double x) const {
    const double lx = std::log(x);
    const double t = (1.0 - q_) * lx;
    return (std::abs(t) > 1e-8 ? std::expm1(t) / t : 1.0 + t / 2) * lx;
  }
  [[nodiscard]] double h_integral_inverse(double x) const {
    double t = x * (1.0 - q_);
    t = std::max(t, -1.0);
    return std::exp((std::abs(t) > 1e-8 ? std::log1p(t) / t : 1.0 - t / 2) * x);
  }
  double n_, q_, h_x1_ = 0, h_n_ = 0, s_ = 0;
};

struct batch {
  std::string name;
  std::vector<std::uint64_t> keys;
  std::vector<std::uint64_t> offsets{0};
};

/// `bags` bags of `len` Zipf(1.05) keys each; ranks are scattered over the table by hashing.
batch make_batch(std::string name, std::uint64_t rows, std::size_t bags, std::size_t len,
                 std::uint64_t seed) {
  batch b{std::move(name), {}, {0}};
  const zipf z(rows, 1.05);
  const counter_rng rng{seed, 0};
  for (std::size_t i = 0; i < bags * len; ++i) {
    b.keys.push_back(mix_ids(seed, z(rng, i)) % rows);
    if ((i + 1) % len == 0) b.offsets.push_back(b.keys.size());
  }
  return b;
}

/// Baseline (a), forward: the same pooled sum written as a plain loop with prefetch, over the
/// same tbb partition of bags.
void plain_pooled_sum(const float* table, std::size_t dim, const batch& b, matrix<float>& out) {
  const std::size_t bags = b.offsets.size() - 1;
  tbb::parallel_for(tbb::blocked_range<std::size_t>(0, bags, 16), [&](const auto& r) {
    const std::size_t end = b.offsets[r.end()];
    for (std::size_t bag = r.begin(); bag < r.end(); ++bag) {
      float* acc = out.row(bag).data();
      for (std::size_t c = 0; c < dim; ++c)
        acc[c] = 0;
      for (std::size_t i = b.offsets[bag]; i < b.offsets[bag + 1]; ++i) {
        if (i + 8 < end)
          for (std::size_t c = 0; c < dim; c += 16)
            __builtin_prefetch(table + b.keys[i + 8] * dim + c);
        const float* src = table + b.keys[i] * dim;
        for (std::size_t c = 0; c < dim; ++c)
          acc[c] += src[c];
      }
    }
  });
}

/// Baseline (a), backward: serial scatter SGD `w[key] -= lr * d_out[bag]` with prefetch (no
/// duplicate summing; serial because duplicates would race).
void plain_scatter_sgd(float* table, std::size_t dim, const batch& b, const matrix<float>& d_out,
                       float lr) {
  const std::size_t bags = b.offsets.size() - 1;
  const std::size_t end = b.keys.size();
  for (std::size_t bag = 0; bag < bags; ++bag) {
    const float* g = d_out.row(bag).data();
    for (std::size_t i = b.offsets[bag]; i < b.offsets[bag + 1]; ++i) {
      if (i + 8 < end)
        for (std::size_t c = 0; c < dim; c += 16)
          __builtin_prefetch(table + b.keys[i + 8] * dim + c, 1);
      float* w = table + b.keys[i] * dim;
      for (std::size_t c = 0; c < dim; ++c)
        w[c] -= lr * g[c];
    }
  }
}

void write_u64(const std::filesystem::path& path, const std::vector<std::uint64_t>& values) {
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(values.data()),
            static_cast<std::streamsize>(values.size() * sizeof(std::uint64_t)));
  if (!out) fail(errc::io_error, cat("bench_embedding: cannot write ", path.string()));
}

std::string run_command(const std::string& command) {
  std::string text;
  FILE* pipe = ::popen(command.c_str(), "r");
  if (pipe == nullptr) return text;
  char buffer[4096];
  while (std::fgets(buffer, sizeof buffer, pipe) != nullptr)
    text += buffer;
  if (::pclose(pipe) != 0) text.clear();
  return text;
}

/// Best rows/s per case from the peer's JSON: {case: {forward, backward}}.
std::map<std::string, std::pair<double, double>> parse_peer(const std::string& json) {
  std::map<std::string, std::pair<double, double>> best;
  const auto number_after = [&](std::size_t from, const std::string& key) {
    const auto at = json.find("\"" + key + "\": ", from);
    return at == std::string::npos ? 0.0 : std::stod(json.substr(at + key.size() + 4));
  };
  for (std::size_t at = json.find("{\"case\": \""); at != std::string::npos;
       at = json.find("{\"case\": \"", at + 1)) {
    const std::size_t name_start = at + 10;
    const std::string name = json.substr(name_start, json.find('"', name_start) - name_start);
    auto& [fwd, bwd] = best[name];
    fwd = std::max(fwd, number_after(at, "forward_rows_per_s"));
    bwd = std::max(bwd, number_after(at, "backward_rows_per_s"));
  }
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  const auto opts = bench::options::parse(argc, argv, {"--no-torch"}, {"--peer"});
  const bool use_torch =
      std::find(opts.rest.begin(), opts.rest.end(), "--no-torch") == opts.rest.end();
  const std::string peer = opts.get(
      "--peer",
      (std::filesystem::path(__FILE__).parent_path() / "peers" / "embeddingbag_torch.py").string());
  const std::size_t table_bytes = opts.quick ? (std::size_t{64} << 20) : (std::size_t{1} << 30);
  const std::size_t bags = 2048;
  const int threads = tbb::info::default_concurrency();
  std::printf(
      "bench_embedding: table %zu MiB, %zu bags per batch, Zipf(1.05) keys, %d tbb "
      "threads\n",
      table_bytes >> 20, bags, threads);

  bool torch_ok = false;
  if (use_torch) {
    torch_ok = !run_command("/usr/bin/python3 -c 'import torch' 2>/dev/null && echo ok").empty();
    if (!torch_ok)
      std::printf(
          "PyTorch comparison skipped: /usr/bin/python3 cannot import torch (install "
          "with: apt-get install -y python3-torch libopenblas0-pthread)\n");
  }

  std::vector<bench::result> results;
  const auto tmp = std::filesystem::temp_directory_path() /
                   ("strata_bench_embedding_" + std::to_string(::getpid()));
  std::filesystem::create_directories(tmp);
  const float lr = 1e-3f;
  const int repeats = 20;  // each timed call is ~0.1–3 ms: take the best of 20 (shared machine)

  for (std::size_t dim : {16u, 64u}) {
    const std::uint64_t rows = table_bytes / (dim * sizeof(float));
    stopwatch build;
    local<optim::sgd> table({{"zipf", rows, dim}}, {.lr = lr}, {.seed = 1});
    std::printf("dim %zu: %llu rows, built and initialised in %.2f s\n", dim,
                static_cast<unsigned long long>(rows), build.seconds());
    std::vector<batch> batches;
    for (std::size_t len : {1u, 20u})
      batches.push_back(make_batch(cat("d", dim, "_L", len), rows, bags, len, 100 + len));

    std::string peer_args;
    for (const auto& b : batches) {
      write_u64(tmp / (b.name + ".keys"), b.keys);
      write_u64(tmp / (b.name + ".offsets"), b.offsets);
      peer_args += cat(" --case ", b.name, ":", (tmp / (b.name + ".keys")).string(), ":",
                       (tmp / (b.name + ".offsets")).string());
    }
    std::map<std::string, std::pair<double, double>> torch_rows;
    if (torch_ok) {
      const std::string json =
          run_command(cat("/usr/bin/python3 ", peer, " --rows ", rows, " --dim ", dim,
                          " --threads 1,2 --repeats ", repeats, peer_args));
      torch_rows = parse_peer(json);
      if (torch_rows.empty()) std::printf("PyTorch peer failed for dim %zu; skipped\n", dim);
    }

    for (const auto& b : batches) {
      const double n = static_cast<double>(b.keys.size());
      matrix<float> out(bags, dim), expected(bags, dim), d_out(bags, dim);
      std::fill(d_out.flat().begin(), d_out.flat().end(), 1.0f);
      pooled_lookup lookup;

      // Verify forward against the plain loop (same summation order: bitwise equal).
      lookup.forward(table, 0, b.keys, b.offsets, pooling::sum, out);
      plain_pooled_sum(table.weights(0).data(), dim, b, expected);
      if (!std::equal(out.flat().begin(), out.flat().end(), expected.flat().begin()))
        fail(errc::internal,
             cat("bench_embedding: pooled forward differs from the plain loop in ", b.name));
      // Verify one backward: row -= lr · (number of occurrences) · 1.
      std::map<std::uint64_t, int> occurrences;
      for (auto k : b.keys)
        ++occurrences[k];
      std::vector<float> before;
      for (const auto& [k, count] : occurrences)
        before.push_back(table.row(0, k)[dim - 1]);
      lookup.backward(table, 0, b.keys, b.offsets, pooling::sum, d_out.view());
      std::size_t j = 0;
      for (const auto& [k, count] : occurrences) {
        const double want = before[j++] - double(lr) * count;
        if (std::abs(table.row(0, k)[dim - 1] - want) > 1e-5 * (1 + std::abs(want)))
          fail(errc::internal,
               cat("bench_embedding: sparse update of key ", k, " wrong in ", b.name));
      }

      const double fwd =
          n / bench::best_seconds(
                  [&] { lookup.forward(table, 0, b.keys, b.offsets, pooling::sum, out); }, repeats);
      const double fwd_plain =
          n / bench::best_seconds(
                  [&] { plain_pooled_sum(table.weights(0).data(), dim, b, expected); }, repeats);
      const double bwd =
          n / bench::best_seconds(
                  [&] { lookup.backward(table, 0, b.keys, b.offsets, pooling::sum, d_out.view()); },
                  repeats);
      auto* raw = const_cast<float*>(table.weights(0).data());
      const double bwd_plain =
          n / bench::best_seconds([&] { plain_scatter_sgd(raw, dim, b, d_out, lr); }, repeats);

      results.push_back(
          {b.name + " forward vs plain prefetch loop", fwd, "rows/s", fwd_plain, fwd / fwd_plain});
      results.push_back({b.name + " backward+SGD vs plain serial scatter", bwd, "rows/s", bwd_plain,
                         bwd / bwd_plain});
      if (const auto it = torch_rows.find(b.name); it != torch_rows.end()) {
        results.push_back({b.name + " forward vs torch EmbeddingBag", fwd, "rows/s",
                           it->second.first, fwd / it->second.first});
        results.push_back({b.name + " backward+SGD vs torch EmbeddingBag", bwd, "rows/s",
                           it->second.second, bwd / it->second.second});
      }

      // hash_table on the same keys (rows created on first touch, in the warm-up run).
      hash_table<optim::sgd> hashed({{"zipf", 0, dim}}, {.lr = lr}, {.seed = 1});
      const double fwd_hash =
          n /
          bench::best_seconds(
              [&] { lookup.forward(hashed, 0, b.keys, b.offsets, pooling::sum, out); }, repeats);
      results.push_back(
          {b.name + " hash_table forward vs local", fwd_hash, "rows/s", fwd, fwd_hash / fwd});
    }
  }

  // Memory per row: hash_table (measured from its containers) vs local (dense arrays).
  for (std::size_t dim : {16u, 64u}) {
    const std::size_t keys = opts.quick ? 100000 : 1000000;
    hash_table<optim::sgd> hashed({{"m", 0, dim}});
    std::vector<std::uint64_t> ids(keys);
    for (std::size_t i = 0; i < keys; ++i)
      ids[i] = counter_rng{3, 3}.bits(i);
    matrix<float> sink(keys, dim);
    hashed.gather(0, ids, sink);
    local<optim::sgd> dense({{"m", keys, dim}});
    const double hash_bytes = double(hashed.memory_bytes(0)) / double(hashed.size(0));
    const double local_bytes = double(dense.memory_bytes(0)) / double(keys);
    results.push_back({cat("bytes/row hash_table vs local, dim ", dim, " sgd, ", keys, " rows"),
                       hash_bytes, "B/row", local_bytes, hash_bytes / local_bytes});
  }
  std::filesystem::remove_all(tmp);
  bench::report(opts, results);
  return 0;
}
