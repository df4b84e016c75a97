#include <catch2/catch.hpp>

#include <cmath>
#include <vector>

#include "strata/core/rng.hpp"
#include "strata/nn.hpp"

using namespace strata;

TEST_CASE("parameter_set tiles one flat buffer with every layer's blocks", "[nn][parameters]") {
  nn::parameter_set ps;
  nn::linear a(ps, 4, 3, "a");
  nn::mlp m(ps, std::vector<std::size_t>{3, 5, 2}, false, "m");
  const std::size_t extra = ps.add("extra", 7, nn::init_scheme::zeros);
  ps.allocate(5);
  REQUIRE(ps.size() == (4 * 3 + 3) + (3 * 5 + 5) + (5 * 2 + 2) + 7);
  REQUIRE(ps.values().size() == ps.size());
  REQUIRE(ps.grads().size() == ps.size());
  REQUIRE(reinterpret_cast<std::uintptr_t>(ps.values().data()) % buffer_alignment == 0);
  REQUIRE(reinterpret_cast<std::uintptr_t>(ps.grads().data()) % buffer_alignment == 0);
  // Blocks are consecutive, disjoint and cover [0, size) exactly once.
  std::vector<int> covered(ps.size(), 0);
  std::size_t next = 0;
  for (const auto& b : ps.blocks()) {
    REQUIRE(b.offset == next);
    next += b.size;
    for (std::size_t i = b.offset; i < b.offset + b.size; ++i)
      ++covered[i];
  }
  REQUIRE(next == ps.size());
  for (int c : covered)
    REQUIRE(c == 1);
  REQUIRE(a.weight_offset() == 0);
  REQUIRE(a.bias_offset() == 12);
  REQUIRE(m.layers()[0].weight_offset() == 15);
  REQUIRE(extra == ps.size() - 7);
  REQUIRE(ps.blocks()[2].name == "m.0.weight");
  // Backward writes every layer's gradient region (no stale values anywhere but "extra").
  std::fill(ps.grads().begin(), ps.grads().end(), std::nanf(""));
  std::vector<float> x(2 * 4, 0.5f), y(2 * 3), dx(2 * 4);
  const std::vector<float> dy(2 * 3, 1.0f);
  a.forward(ps.values(), matrix_view<const float>(x.data(), 2, 4),
            matrix_view<float>(y.data(), 2, 3));
  a.backward(ps.values(), matrix_view<const float>(x.data(), 2, 4),
             matrix_view<const float>(dy.data(), 2, 3), ps.grads());
  for (std::size_t i = 0; i < 15; ++i)
    REQUIRE(!std::isnan(ps.grads()[i]));
  REQUIRE(std::isnan(ps.grads()[15]));

  REQUIRE_THROWS_WITH(ps.add("late", 3, nn::init_scheme::zeros),
                      Catch::Contains("cannot add block 'late' after allocate()"));
}

TEST_CASE("initialisation is keyed by (seed, block, element) and follows its scheme",
          "[nn][parameters]") {
  const auto build = [](std::uint64_t seed) {
    nn::parameter_set ps;
    nn::linear a(ps, 30, 20, "a");
    ps.add("zeros", 4, nn::init_scheme::zeros);
    ps.allocate(seed);
    return ps;
  };
  const auto p1 = build(9), p2 = build(9), p3 = build(10);
  REQUIRE(std::equal(p1.values().begin(), p1.values().end(), p2.values().begin()));
  REQUIRE(!std::equal(p1.values().begin(), p1.values().end(), p3.values().begin()));
  const auto w = p1.values().first(600);
  const float a = std::sqrt(6.0f / 50.0f);
  double mean = 0;
  for (float v : w) {
    REQUIRE(std::abs(v) <= a);
    mean += v;
  }
  REQUIRE(std::abs(mean / 600) < 0.05);
  // Exact formula for one element.
  const counter_rng rng{9, mix_ids(0x6e6e, 0)};
  REQUIRE(w[123] == rng.uniform(123, -a, a));
  const auto bias = p1.values().subspan(600, 20);
  for (float v : bias)
    REQUIRE(std::abs(v) <= 1.0f / std::sqrt(30.0f));
  for (float v : p1.values().subspan(620, 4))
    REQUIRE(v == 0.0f);
}
