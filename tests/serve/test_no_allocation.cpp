// serve::predictor allocates nothing per call after warm-up: this program counts the global
// operator new (replaced below, for this test binary only) around warm predict and
// predict_lines calls of a DLRM and a Wide & Deep bundle. (Memory Eigen, a BLAS or oneTBB take
// with malloc inside the GEMMs is not counted here.)
#include <catch2/catch.hpp>

#include <atomic>
#include <cstdlib>
#include <new>
#include <string>
#include <vector>

#include "strata/embedding/local.hpp"
#include "strata/models/dlrm.hpp"
#include "strata/models/wide_deep.hpp"
#include "strata/optim/adagrad.hpp"
#include "strata/serve.hpp"
#include "strata/train/trainer.hpp"
#include "support/temp_dir.hpp"

namespace {
std::atomic<long> allocations{0};
}  // namespace

void* operator new(std::size_t n) {
  allocations.fetch_add(1, std::memory_order_relaxed);
  if (void* p = std::malloc(n == 0 ? 1 : n)) return p;
  throw std::bad_alloc();
}
// Every other plain form too, so all of them pair malloc with free (a sanitizer's own
// nothrow or array forms would otherwise meet this free: alloc-dealloc mismatch under ASan).
void* operator new[](std::size_t n) {
  return ::operator new(n);
}
void* operator new(std::size_t n, const std::nothrow_t&) noexcept {
  allocations.fetch_add(1, std::memory_order_relaxed);
  return std::malloc(n == 0 ? 1 : n);
}
void* operator new[](std::size_t n, const std::nothrow_t& tag) noexcept {
  return ::operator new(n, tag);
}
void operator delete(void* p) noexcept {
  std::free(p);
}
void operator delete(void* p, std::size_t) noexcept {
  std::free(p);
}
void operator delete[](void* p) noexcept {
  std::free(p);
}
void operator delete[](void* p, std::size_t) noexcept {
  std::free(p);
}
void operator delete(void* p, const std::nothrow_t&) noexcept {
  std::free(p);
}
void operator delete[](void* p, const std::nothrow_t&) noexcept {
  std::free(p);
}

using namespace strata;

namespace {

/// A Criteo line whose fields are all present (sample i).
std::string line(std::size_t i) {
  std::string s = i % 2 == 0 ? "1" : "0";
  for (std::size_t j = 0; j < 13; ++j)
    s += cat('\t', (i * 7 + j) % 11);
  for (std::size_t j = 0; j < 26; ++j)
    s += cat('\t', std::hex, (i * 2654435761u + j * 97) & 0xffffff);
  return s;
}

template <class Trainer>
void check_no_allocation(const typename Trainer::model_type::config& config) {
  using Model = typename Trainer::model_type;
  strata_test::temp_dir work("serve_alloc");
  data::ctr_dataset set;
  for (std::size_t i = 0; i < 256; ++i) {
    std::vector<float> dense(13, 0.1f * static_cast<float>(i % 7));
    std::vector<std::uint64_t> keys(26);
    for (std::size_t c = 0; c < 26; ++c)
      keys[c] = (i * 31 + c) % 50;
    set.append(dense, keys, static_cast<float>(i % 2));
  }
  train::trainer_options o;
  o.workers = 1;
  o.batch = 32;
  o.max_steps = 4;
  o.progress = false;
  Trainer trainer(config, optim::adagrad{}, o);
  trainer.fit(set);
  serve::export_trainer(trainer, config, work.path / "b");
  const serve::predictor<Model> p(work.path / "b");

  std::vector<std::size_t> idx(64);
  std::iota(idx.begin(), idx.end(), std::size_t{0});
  const auto batch = set.gather(idx);
  std::vector<std::string> text;
  for (std::size_t i = 0; i < 64; ++i)
    text.push_back(line(i));
  const std::vector<std::string_view> lines(text.begin(), text.end());
  std::vector<float> out(64);
  // Warm-up: the largest batch once.
  p.predict(batch.dense.view(), batch.keys.view(), out);
  p.predict_lines(lines, out);
  const long before = allocations.load();
  for (std::size_t n : {1, 17, 64}) {
    p.predict(batch.dense.view().rows_slice(0, n), batch.keys.view().rows_slice(0, n),
              std::span(out.data(), n));
    p.predict_lines(std::span(lines.data(), n), std::span(out.data(), n));
  }
  const long during = allocations.load() - before;
  CHECK(during == 0);
}

}  // namespace

TEST_CASE("a warm predictor allocates nothing per call", "[serve][allocation]") {
  models::dlrm::config d;
  d.embedding_dim = 4;
  d.table_rows = {50};
  d.bottom_mlp = {8, 4};
  d.top_mlp = {8, 1};
  check_no_allocation<
      train::trainer<models::dlrm, embedding::local<optim::adagrad>, comm::ring_allreduce>>(d);
  models::wide_deep::config w;
  w.deep_dim = 4;
  w.table_rows = {50};
  w.deep_mlp = {8, 1};
  check_no_allocation<
      train::trainer<models::wide_deep, embedding::local<optim::adagrad>, comm::ring_allreduce>>(w);
}
