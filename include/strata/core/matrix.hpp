/// @file matrix.hpp
/// Non-owning row-major matrix views over contiguous memory, and an owning matrix.
#pragma once

#include <cstddef>
#include <span>
#include <type_traits>

#include "strata/core/buffer.hpp"
#include "strata/core/error.hpp"

namespace strata {

/// A row-major view: element (r, c) is `data[r * stride + c]`. Does not own its memory.
/// `T` may be const. Cheap to copy; thread-safety is that of the viewed memory.
template <class T>
class matrix_view {
 public:
  matrix_view() = default;
  matrix_view(T* data, std::size_t rows, std::size_t cols, std::size_t stride)
      : data_(data), rows_(rows), cols_(cols), stride_(stride) {
    STRATA_EXPECTS(stride >= cols, "matrix_view: stride ", stride, " is smaller than cols ", cols);
  }
  matrix_view(T* data, std::size_t rows, std::size_t cols) : matrix_view(data, rows, cols, cols) {}
  /// Views a span as rows × cols; the span must hold exactly rows * cols values.
  matrix_view(std::span<T> values, std::size_t rows, std::size_t cols)
      : matrix_view(values.data(), rows, cols, cols) {
    STRATA_EXPECTS(values.size() == rows * cols, "matrix_view: span of ", values.size(),
                   " values cannot be viewed as ", rows, " x ", cols);
  }
  /// A view of non-const T converts to a view of const T.
  template <class U>
  requires std::is_same_v<const U, T> matrix_view(
      matrix_view<U> other)  // NOLINT(google-explicit-constructor)
      : data_(other.data()), rows_(other.rows()), cols_(other.cols()), stride_(other.stride()) {}

  [[nodiscard]] T* data() const noexcept { return data_; }
  [[nodiscard]] std::size_t rows() const noexcept { return rows_; }
  [[nodiscard]] std::size_t cols() const noexcept { return cols_; }
  [[nodiscard]] std::size_t stride() const noexcept { return stride_; }
  [[nodiscard]] std::size_t size() const noexcept { return rows_ * cols_; }
  [[nodiscard]] bool contiguous() const noexcept { return stride_ == cols_; }

  T& operator()(std::size_t r, std::size_t c) const noexcept { return data_[r * stride_ + c]; }
  [[nodiscard]] std::span<T> row(std::size_t r) const noexcept {
    return {data_ + r * stride_, cols_};
  }
  /// Rows [first, first + count) as a view.
  [[nodiscard]] matrix_view rows_slice(std::size_t first, std::size_t count) const {
    STRATA_EXPECTS(first <= rows_ && count <= rows_ - first, "matrix_view: rows [", first, ", ",
                   first + count, ") outside ", rows_, " rows");
    return {data_ + first * stride_, count, cols_, stride_};
  }
  /// All values as one span; only for contiguous views.
  [[nodiscard]] std::span<T> flat() const {
    STRATA_EXPECTS(contiguous(), "matrix_view: flat() needs a contiguous view");
    return {data_, rows_ * cols_};
  }

 private:
  T* data_ = nullptr;
  std::size_t rows_ = 0;
  std::size_t cols_ = 0;
  std::size_t stride_ = 0;
};

/// An owning row-major matrix on a 64-byte aligned buffer (zero-initialised).
template <class T>
class matrix {
 public:
  matrix() = default;
  matrix(std::size_t rows, std::size_t cols) : values_(rows * cols), rows_(rows), cols_(cols) {}

  [[nodiscard]] std::size_t rows() const noexcept { return rows_; }
  [[nodiscard]] std::size_t cols() const noexcept { return cols_; }
  [[nodiscard]] std::size_t size() const noexcept { return values_.size(); }
  T* data() noexcept { return values_.data(); }
  const T* data() const noexcept { return values_.data(); }
  T& operator()(std::size_t r, std::size_t c) noexcept { return values_[r * cols_ + c]; }
  const T& operator()(std::size_t r, std::size_t c) const noexcept {
    return values_[r * cols_ + c];
  }
  std::span<T> row(std::size_t r) noexcept { return {values_.data() + r * cols_, cols_}; }
  std::span<const T> row(std::size_t r) const noexcept {
    return {values_.data() + r * cols_, cols_};
  }
  std::span<T> flat() noexcept { return values_.span(); }
  std::span<const T> flat() const noexcept { return values_.span(); }
  matrix_view<T> view() noexcept { return {values_.data(), rows_, cols_}; }
  matrix_view<const T> view() const noexcept { return {values_.data(), rows_, cols_}; }
  operator matrix_view<T>() noexcept { return view(); }              // NOLINT
  operator matrix_view<const T>() const noexcept { return view(); }  // NOLINT

 private:
  aligned_buffer<T> values_;
  std::size_t rows_ = 0;
  std::size_t cols_ = 0;
};

}  // namespace strata
