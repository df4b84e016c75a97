#include <catch2/catch.hpp>

#include <cstdint>
#include <limits>
#include <type_traits>
#include <vector>

#include "strata/core/buffer.hpp"
#include "strata/core/finite.hpp"

using namespace strata;

namespace {
template <class T>
bool aligned64(const T* p) {
  return reinterpret_cast<std::uintptr_t>(p) % 64 == 0;
}
struct three {
  char c[3];
};
}  // namespace

TEMPLATE_TEST_CASE("aligned_buffer is 64-byte aligned and zeroed", "[core][buffer]", char, float,
                   double, std::int64_t, three) {
  for (std::size_t n : {1u, 2u, 3u, 15u, 16u, 17u, 63u, 64u, 65u, 1000u, 4097u}) {
    aligned_buffer<TestType> b(n);
    REQUIRE(b.size() == n);
    REQUIRE(!b.empty());
    REQUIRE(aligned64(b.data()));
    const auto* bytes = reinterpret_cast<const unsigned char*>(b.data());
    for (std::size_t i = 0; i < n * sizeof(TestType); ++i)
      REQUIRE(bytes[i] == 0);
  }
}

TEST_CASE("aligned_buffer fills with a value and converts to spans", "[core][buffer]") {
  aligned_buffer<float> b(10, 2.5f);
  for (float v : b)
    REQUIRE(v == 2.5f);
  std::span<float> s = b;
  std::span<const float> cs = static_cast<const aligned_buffer<float>&>(b);
  REQUIRE(s.size() == 10);
  REQUIRE(cs.data() == b.data());
  s[3] = 7;
  REQUIRE(b[3] == 7);
  REQUIRE(b.end() - b.begin() == 10);
  REQUIRE(as_bytes(b.span()).size() == 40);
  REQUIRE(as_writable_bytes(b.span()).size() == 40);
}

TEST_CASE("aligned_buffer copies deeply", "[core][buffer]") {
  aligned_buffer<int> a(5);
  for (int i = 0; i < 5; ++i)
    a[static_cast<std::size_t>(i)] = i * i;
  aligned_buffer<int> b(a);
  REQUIRE(b.data() != a.data());
  REQUIRE(aligned64(b.data()));
  REQUIRE(std::equal(a.begin(), a.end(), b.begin(), b.end()));
  b[0] = 99;
  REQUIRE(a[0] == 0);

  aligned_buffer<int> c(2);
  c = a;
  REQUIRE(c.size() == 5);
  REQUIRE(std::equal(a.begin(), a.end(), c.begin(), c.end()));
  const auto& same = c;
  c = same;  // self-assignment keeps the values
  REQUIRE(c.size() == 5);
  REQUIRE(c[4] == 16);
}

TEST_CASE("aligned_buffer moves without copying", "[core][buffer]") {
  static_assert(std::is_nothrow_move_constructible_v<aligned_buffer<float>>);
  static_assert(std::is_nothrow_move_assignable_v<aligned_buffer<float>>);
  aligned_buffer<float> a(100, 1.0f);
  const float* p = a.data();
  aligned_buffer<float> b(std::move(a));
  REQUIRE(b.data() == p);
  REQUIRE(b.size() == 100);
  REQUIRE(a.size() == 0);  // NOLINT(bugprone-use-after-move): moved-from is empty
  REQUIRE(a.empty());
  REQUIRE(a.data() == nullptr);

  aligned_buffer<float> c(3);
  c = std::move(b);
  REQUIRE(c.data() == p);
  REQUIRE(c.size() == 100);
  REQUIRE(b.empty());

  auto& self = c;
  c = std::move(self);  // self-move keeps the contents
  REQUIRE(c.data() == p);
  REQUIRE(c.size() == 100);
}

TEST_CASE("aligned_buffer of size 0", "[core][buffer]") {
  aligned_buffer<double> empty(0), defaulted;
  for (auto* b : {&empty, &defaulted}) {
    REQUIRE(b->size() == 0);
    REQUIRE(b->empty());
    REQUIRE(b->data() == nullptr);
    REQUIRE(b->begin() == b->end());
    REQUIRE(b->span().empty());
  }
  aligned_buffer<double> copy(empty);
  REQUIRE(copy.empty());
  aligned_buffer<double> filled(0, 3.0);
  REQUIRE(filled.empty());
}

TEST_CASE("aligned_buffer refuses sizes that overflow", "[core][buffer]") {
  REQUIRE_THROWS_AS(aligned_buffer<double>(std::numeric_limits<std::size_t>::max() / 4),
                    std::bad_alloc);
}

TEST_CASE("first_non_finite finds the first NaN or infinity, in any block", "[core][finite]") {
  std::vector<float> v(10'000, 1.5f);
  CHECK(detail::first_non_finite(v) == v.size());
  CHECK(detail::all_finite(v));
  CHECK(detail::all_finite(std::span<const float>{}));
  v[9'999] = std::numeric_limits<float>::max();  // large but finite
  CHECK(detail::all_finite(v));
  for (const float bad :
       {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
        -std::numeric_limits<float>::infinity()})
    for (const std::size_t at :
         {std::size_t{0}, std::size_t{4095}, std::size_t{4096}, std::size_t{9'998}}) {
      auto w = v;
      w[at] = bad;
      w[9'999] = bad;  // a later one does not hide the first
      INFO("value " << bad << " at " << at);
      CHECK(detail::first_non_finite(w) == at);
      CHECK_FALSE(detail::all_finite(w));
    }
}
