#include <catch2/catch.hpp>

#include <numeric>
#include <type_traits>
#include <vector>

#include "strata/core/matrix.hpp"

using namespace strata;

TEST_CASE("matrix_view indexes row-major with a stride", "[core][matrix]") {
  std::vector<int> storage(4 * 5);
  std::iota(storage.begin(), storage.end(), 0);
  matrix_view<int> m(storage.data(), 4, 3, 5);  // 4 x 3 inside 4 x 5
  REQUIRE(m.rows() == 4);
  REQUIRE(m.cols() == 3);
  REQUIRE(m.stride() == 5);
  REQUIRE(m.size() == 12);
  REQUIRE(!m.contiguous());
  for (std::size_t r = 0; r < 4; ++r)
    for (std::size_t c = 0; c < 3; ++c)
      REQUIRE(m(r, c) == static_cast<int>(r * 5 + c));
  auto row2 = m.row(2);
  REQUIRE(row2.size() == 3);
  REQUIRE(row2[0] == 10);
  m(1, 2) = -1;
  REQUIRE(storage[7] == -1);
  REQUIRE_THROWS_WITH(m.flat(), Catch::Contains("contiguous"));

  const auto tail = m.rows_slice(1, 3);
  REQUIRE(tail.rows() == 3);
  REQUIRE(tail.stride() == 5);
  REQUIRE(tail(0, 0) == 5);
  REQUIRE(tail(2, 1) == 16);
  REQUIRE(m.rows_slice(4, 0).rows() == 0);
}

TEST_CASE("matrix_view rejects bad shapes with clear errors", "[core][matrix]") {
  std::vector<float> storage(12);
  REQUIRE_THROWS_WITH(matrix_view<float>(storage.data(), 3, 4, 2),
                      Catch::Contains("stride 2 is smaller than cols 4"));
  REQUIRE_THROWS_WITH(matrix_view<float>(std::span<float>(storage), 5, 3),
                      Catch::Contains("span of 12 values cannot be viewed as 5 x 3"));
  matrix_view<float> m(std::span<float>(storage), 4, 3);
  REQUIRE(m.contiguous());
  REQUIRE(m.flat().size() == 12);
  try {
    (void)m.rows_slice(3, 2);
    FAIL("no throw");
  } catch (const error& e) {
    REQUIRE(e.code() == errc::invalid_argument);
    REQUIRE_THAT(e.what(), Catch::Contains("rows [3, 5) outside 4 rows"));
  }
  // first + count wrapping around must not pass the check
  REQUIRE_THROWS_AS(m.rows_slice(std::numeric_limits<std::size_t>::max(), 2), error);
  REQUIRE_THROWS_AS(m.rows_slice(5, 0), error);
}

TEST_CASE("matrix_view<T> converts to matrix_view<const T> only", "[core][matrix]") {
  static_assert(std::is_convertible_v<matrix_view<float>, matrix_view<const float>>);
  static_assert(!std::is_convertible_v<matrix_view<const float>, matrix_view<float>>);
  static_assert(!std::is_convertible_v<matrix_view<float>, matrix_view<const double>>);
  std::vector<double> storage{1, 2, 3, 4, 5, 6};
  matrix_view<double> m(storage.data(), 2, 2, 3);
  matrix_view<const double> c = m;
  REQUIRE(c.data() == m.data());
  REQUIRE(c.rows() == 2);
  REQUIRE(c.cols() == 2);
  REQUIRE(c.stride() == 3);
  REQUIRE(c(1, 1) == 5);
}

TEST_CASE("matrix owns zeroed aligned storage and views it", "[core][matrix]") {
  matrix<float> m(3, 4);
  REQUIRE(m.rows() == 3);
  REQUIRE(m.cols() == 4);
  REQUIRE(m.size() == 12);
  REQUIRE(reinterpret_cast<std::uintptr_t>(m.data()) % 64 == 0);
  for (float v : m.flat())
    REQUIRE(v == 0);
  m(2, 1) = 5;
  REQUIRE(m.flat()[9] == 5);
  REQUIRE(m.row(2)[1] == 5);
  matrix_view<float> v = m;
  REQUIRE(v(2, 1) == 5);
  REQUIRE(v.contiguous());
  const matrix<float>& cm = m;
  matrix_view<const float> cv = cm;
  REQUIRE(cv(2, 1) == 5);
  REQUIRE(cm.row(2).size() == 4);

  matrix<float> copy = m;
  copy(0, 0) = 1;
  REQUIRE(m(0, 0) == 0);
  matrix<float> empty;
  REQUIRE(empty.size() == 0);
  REQUIRE(empty.view().size() == 0);
}
