/// @file bench_embedding.cpp
/// Pooled embedding lookup (forward) and sparse update (backward: de-duplication + optimizer)
/// throughput of strata::embedding::local on a large table with Zipf(1.05) keys, against
/// same-run baselines:
///   (a) a plain pooled gather loop with software prefetch (forward) / a plain serial scatter
///       loop with prefetch that applies the optimizer once per occurrence, SGD and Adagrad
///       (backward): the library's overhead, goal ratio >= 0.8;
///   (b) PyTorch nn.EmbeddingBag(mode='sum', sparse=True) + torch.optim.SGD on the same keys
///       (bench/peers/embeddingbag_torch.py, best of 1 and 2 torch threads): goal ratio >= 2;
///   (c) FBGEMM's table-batched embedding (SplitTableBatchedEmbeddingBagsCodegen on CPU,
///       EXACT_SGD / EXACT_ADAGRAD fused into its backward; bench/peers/embedding_tbe.py run by
///       the python of the venv that bench/peers/venv.sh makes, best of 1 and 2 threads): goal
///       ratio >= 1.5 for SGD.
/// rows/s = keys processed per second (one gathered or updated row per key). Each pair of
/// same-run timings alternates the two loops and keeps the best of each (a shared machine).
/// Also reports bytes per row of hash_table vs local storage.
///
/// Usage: bench_embedding [--quick] [--json PATH] [--no-torch] [--peer path/to/script.py]
///                        [--tbe-python path/to/python]
///   table 1 GiB (--quick: 64 MiB), dim 16 and 64, bag length 1 and 20, 2048 bags per batch.
///   --no-torch skips (b). --tbe-python defaults to <repo>/build/peers-venv/bin/peer-python;
///   when it is missing (or "none") (c) is skipped: create it with bench/peers/venv.sh, the
///   bench never does.
#include <oneapi/tbb/blocked_range.h>
#include <oneapi/tbb/info.h>
#include <oneapi/tbb/parallel_for.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
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

/// Baseline (a), backward: serial scatter Adagrad, the optimizer's own arithmetic applied once
/// per occurrence (no duplicate summing) with prefetch of the row and its accumulator.
void plain_scatter_adagrad(float* table, float* accumulators, std::size_t dim, const batch& b,
                           const matrix<float>& d_out, const optim::adagrad& opt) {
  const std::size_t bags = b.offsets.size() - 1;
  const std::size_t end = b.keys.size();
  const float lr = opt.lr, eps = opt.eps, init = opt.initial_accumulator;
  for (std::size_t bag = 0; bag < bags; ++bag) {
    const float* g = d_out.row(bag).data();
    for (std::size_t i = b.offsets[bag]; i < b.offsets[bag + 1]; ++i) {
      if (i + 8 < end)
        for (std::size_t c = 0; c < dim; c += 16) {
          __builtin_prefetch(table + b.keys[i + 8] * dim + c, 1);
          __builtin_prefetch(accumulators + b.keys[i + 8] * dim + c, 1);
        }
      float* w = table + b.keys[i] * dim;
      float* acc = accumulators + b.keys[i] * dim;
      for (std::size_t c = 0; c < dim; ++c) {
        acc[c] += g[c] * g[c];
        w[c] -= lr * g[c] / (std::sqrt(acc[c] + init) + eps);
      }
    }
  }
}

/// Best (minimum) seconds of `a` and of `b` over `repeats` alternating runs each, after one
/// warm-up run of both: the two see the same machine load, so their ratio is steadier than
/// that of two separate best-of-N series.
std::pair<double, double> best_seconds_pair(const std::function<void()>& a,
                                            const std::function<void()>& b, int repeats) {
  a();
  b();
  double best_a = 1e300, best_b = 1e300;
  for (int i = 0; i < repeats; ++i) {
    stopwatch wa;
    a();
    best_a = std::min(best_a, wa.seconds());
    stopwatch wb;
    b();
    best_b = std::min(best_b, wb.seconds());
  }
  return {best_a, best_b};
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

/// Best rows/s per case from a peer's JSON: {case: {forward, backward}}. Reads every flat
/// object of the "results" list that has a "case" key, whatever the order of its keys (so
/// extra keys such as "peer" or "threads" do not matter); a missing number counts as 0.
std::map<std::string, std::pair<double, double>> parse_peer(const std::string& json) {
  std::map<std::string, std::pair<double, double>> best;
  for (std::size_t at = json.find("\"case\""); at != std::string::npos;
       at = json.find("\"case\"", at + 1)) {
    const std::size_t open = json.rfind('{', at), close = json.find('}', at);
    if (open == std::string::npos || close == std::string::npos) break;
    const std::string object = json.substr(open, close - open);
    const auto value_of = [&](const std::string& key) -> std::string {
      const auto k = object.find("\"" + key + "\"");
      if (k == std::string::npos) return {};
      const auto colon = object.find(':', k);
      const auto start = object.find_first_not_of(" \t\n\"", colon + 1);
      const auto end = object.find_first_of(",}\"", start);
      return start == std::string::npos ? std::string{} : object.substr(start, end - start);
    };
    const std::string name = value_of("case");
    const auto number = [&](const std::string& key) {
      const std::string text = value_of(key);
      try {
        return text.empty() ? 0.0 : std::stod(text);
      } catch (const std::exception&) {
        return 0.0;
      }
    };
    if (name.empty()) continue;
    auto& [fwd, bwd] = best[name];
    fwd = std::max(fwd, number("forward_rows_per_s"));
    bwd = std::max(bwd, number("backward_rows_per_s"));
  }
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  const auto opts = bench::options::parse(argc, argv, {"--no-torch"}, {"--peer", "--tbe-python"});
  const bool use_torch =
      std::find(opts.rest.begin(), opts.rest.end(), "--no-torch") == opts.rest.end();
  const std::filesystem::path bench_dir = std::filesystem::path(__FILE__).parent_path();
  const std::string peer =
      opts.get("--peer", (bench_dir / "peers" / "embeddingbag_torch.py").string());
  const std::string tbe_script = (bench_dir / "peers" / "embedding_tbe.py").string();
  const std::string tbe_python =
      opts.get("--tbe-python",
               (bench_dir.parent_path() / "build" / "peers-venv" / "bin" / "peer-python").string());
  const bool use_tbe = tbe_python != "none";
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
  bool tbe_ok = false;
  if (use_tbe) {
    if (!std::filesystem::exists(tbe_python))
      std::printf(
          "FBGEMM TBE comparison skipped: no peer python at %s (create the venv with "
          "bench/peers/venv.sh, or pass --tbe-python PATH)\n",
          tbe_python.c_str());
    else if (!std::filesystem::exists(tbe_script))
      std::printf("FBGEMM TBE comparison skipped: %s is missing\n", tbe_script.c_str());
    else
      tbe_ok = true;
  }

  std::vector<bench::result> results;
  const auto tmp = std::filesystem::temp_directory_path() /
                   ("strata_bench_embedding_" + std::to_string(::getpid()));
  std::filesystem::create_directories(tmp);
  const float lr = 1e-3f;
  const int repeats = 20;  // each timed call is ~0.02–5 ms: take the best of 20 (shared machine)

  const optim::adagrad adagrad{.lr = lr};
  for (std::size_t dim : {16u, 64u}) {
    const std::uint64_t rows = table_bytes / (dim * sizeof(float));
    stopwatch build;
    local<optim::sgd> table({{"zipf", rows, dim}}, {.lr = lr}, {.seed = 1});
    local<optim::adagrad> adagrad_table({{"zipf", rows, dim}}, adagrad, {.seed = 1});
    std::printf("dim %zu: %llu rows (SGD and Adagrad tables), built and initialised in %.2f s\n",
                dim, static_cast<unsigned long long>(rows), build.seconds());
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
    std::map<std::string, std::pair<double, double>> torch_rows, tbe_rows;
    if (torch_ok) {
      const std::string json =
          run_command(cat("/usr/bin/python3 ", peer, " --rows ", rows, " --dim ", dim,
                          " --threads 1,2 --repeats ", repeats, peer_args));
      torch_rows = parse_peer(json);
      if (torch_rows.empty()) std::printf("PyTorch peer failed for dim %zu; skipped\n", dim);
    }
    std::map<std::string, std::pair<double, double>> tbe_adagrad_rows;
    if (tbe_ok) {
      const auto run_tbe = [&](const char* optimizer) {
        const std::string json = run_command(
            cat("'", tbe_python, "' '", tbe_script, "' --optimizer ", optimizer, " --rows ", rows,
                " --dim ", dim, " --threads 1,2 --repeats ", repeats, peer_args));
        auto best = parse_peer(json);
        if (best.empty())
          std::printf(
              "FBGEMM TBE peer (%s) failed for dim %zu (run %s %s by hand to see why); "
              "skipped\n",
              optimizer, dim, tbe_python.c_str(), tbe_script.c_str());
        else if (const auto at = json.find("\"peer\": \""); at != std::string::npos)
          std::printf("dim %zu: FBGEMM TBE peer %s, %s\n", dim,
                      json.substr(at + 9, json.find('"', at + 9) - at - 9).c_str(), optimizer);
        return best;
      };
      tbe_rows = run_tbe("sgd");
      tbe_adagrad_rows = run_tbe("adagrad");
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

      // Verify one Adagrad backward the same way: acc += count², row -= lr·count/(√(acc+a0)+ε).
      std::vector<std::pair<float, float>> adagrad_before;
      for (const auto& [k, count] : occurrences)
        adagrad_before.emplace_back(adagrad_table.row(0, k)[dim - 1],
                                    adagrad_table.state(0, k)[dim - 1]);
      lookup.backward(adagrad_table, 0, b.keys, b.offsets, pooling::sum, d_out.view());
      j = 0;
      for (const auto& [k, count] : occurrences) {
        const auto [w0, acc0] = adagrad_before[j++];
        const double acc = double(acc0) + double(count) * count;
        const double want =
            w0 - double(lr) * count / (std::sqrt(acc + adagrad.initial_accumulator) + adagrad.eps);
        if (std::abs(adagrad_table.state(0, k)[dim - 1] - acc) > 1e-5 * (1 + acc) ||
            std::abs(adagrad_table.row(0, k)[dim - 1] - want) > 1e-5 * (1 + std::abs(want)))
          fail(errc::internal,
               cat("bench_embedding: Adagrad update of key ", k, " wrong in ", b.name));
      }

      const auto [fwd_s, fwd_plain_s] = best_seconds_pair(
          [&] { lookup.forward(table, 0, b.keys, b.offsets, pooling::sum, out); },
          [&] { plain_pooled_sum(table.weights(0).data(), dim, b, expected); }, repeats);
      auto* raw = const_cast<float*>(table.weights(0).data());
      const auto [bwd_s, bwd_plain_s] = best_seconds_pair(
          [&] { lookup.backward(table, 0, b.keys, b.offsets, pooling::sum, d_out.view()); },
          [&] { plain_scatter_sgd(raw, dim, b, d_out, lr); }, repeats);
      auto* raw_adagrad = const_cast<float*>(adagrad_table.weights(0).data());
      auto* raw_acc = adagrad_table.state(0, 0).data();  // rows × dim accumulators
      const auto [ada_s, ada_plain_s] = best_seconds_pair(
          [&] { lookup.backward(adagrad_table, 0, b.keys, b.offsets, pooling::sum, d_out.view()); },
          [&] { plain_scatter_adagrad(raw_adagrad, raw_acc, dim, b, d_out, adagrad); }, repeats);
      const double fwd = n / fwd_s, fwd_plain = n / fwd_plain_s;
      const double bwd = n / bwd_s, bwd_plain = n / bwd_plain_s;
      const double ada = n / ada_s, ada_plain = n / ada_plain_s;

      results.push_back(
          {b.name + " forward vs plain prefetch loop", fwd, "rows/s", fwd_plain, fwd / fwd_plain});
      results.push_back({b.name + " backward+SGD vs plain serial scatter", bwd, "rows/s", bwd_plain,
                         bwd / bwd_plain});
      results.push_back({b.name + " backward+Adagrad vs plain serial scatter", ada, "rows/s",
                         ada_plain, ada / ada_plain});
      if (const auto it = torch_rows.find(b.name); it != torch_rows.end()) {
        results.push_back({b.name + " forward vs torch EmbeddingBag", fwd, "rows/s",
                           it->second.first, fwd / it->second.first});
        results.push_back({b.name + " backward+SGD vs torch EmbeddingBag", bwd, "rows/s",
                           it->second.second, bwd / it->second.second});
      }
      if (const auto it = tbe_rows.find(b.name); it != tbe_rows.end()) {
        results.push_back({b.name + " forward vs FBGEMM TBE", fwd, "rows/s", it->second.first,
                           fwd / it->second.first});
        results.push_back({b.name + " backward+SGD vs FBGEMM TBE", bwd, "rows/s", it->second.second,
                           bwd / it->second.second});
      }
      if (const auto it = tbe_adagrad_rows.find(b.name); it != tbe_adagrad_rows.end())
        results.push_back({b.name + " backward+Adagrad vs FBGEMM TBE", ada, "rows/s",
                           it->second.second, ada / it->second.second});

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
