/// @file buffer.hpp
/// 64-byte aligned, zero-initialised, owning buffers of trivially copyable values.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <new>
#include <span>
#include <type_traits>
#include <utility>

#include "strata/core/error.hpp"

namespace strata {

/// Alignment of every strata buffer: one cache line, enough for AVX-512 loads.
inline constexpr std::size_t buffer_alignment = 64;

/// An owning, fixed-size, 64-byte aligned array of `T` (zero-initialised).
/// Cost: one allocation; copies are deep. Not thread-safe for concurrent mutation.
template <class T>
class aligned_buffer {
  static_assert(std::is_trivially_copyable_v<T>, "aligned_buffer holds trivially copyable values");

  struct free_deleter {
    void operator()(T* p) const noexcept { std::free(p); }
  };

 public:
  using value_type = T;

  aligned_buffer() = default;
  explicit aligned_buffer(std::size_t count) : size_(count) {
    if (count == 0) return;
    if (count > (std::numeric_limits<std::size_t>::max() - buffer_alignment) / sizeof(T))
      throw std::bad_alloc();
    const std::size_t bytes =
        (count * sizeof(T) + buffer_alignment - 1) / buffer_alignment * buffer_alignment;
    void* raw = std::aligned_alloc(buffer_alignment, bytes);
    if (raw == nullptr) throw std::bad_alloc();
    std::memset(raw, 0, bytes);
    data_.reset(static_cast<T*>(raw));
  }
  aligned_buffer(std::size_t count, T value) : aligned_buffer(count) {
    std::fill_n(data_.get(), count, value);
  }
  aligned_buffer(const aligned_buffer& other) : aligned_buffer(other.size_) {
    if (size_ != 0) std::memcpy(data_.get(), other.data_.get(), size_ * sizeof(T));
  }
  aligned_buffer& operator=(const aligned_buffer& other) {
    if (this != &other) *this = aligned_buffer(other);
    return *this;
  }
  aligned_buffer(aligned_buffer&& other) noexcept
      : data_(std::move(other.data_)), size_(std::exchange(other.size_, 0)) {}
  aligned_buffer& operator=(aligned_buffer&& other) noexcept {
    if (this != &other) {
      data_ = std::move(other.data_);
      size_ = std::exchange(other.size_, 0);
    }
    return *this;
  }

  [[nodiscard]] T* data() noexcept { return data_.get(); }
  [[nodiscard]] const T* data() const noexcept { return data_.get(); }
  [[nodiscard]] std::size_t size() const noexcept { return size_; }
  [[nodiscard]] bool empty() const noexcept { return size_ == 0; }
  T& operator[](std::size_t i) noexcept { return data_.get()[i]; }
  const T& operator[](std::size_t i) const noexcept { return data_.get()[i]; }
  T* begin() noexcept { return data(); }
  T* end() noexcept { return data() + size_; }
  const T* begin() const noexcept { return data(); }
  const T* end() const noexcept { return data() + size_; }
  std::span<T> span() noexcept { return {data(), size_}; }
  std::span<const T> span() const noexcept { return {data(), size_}; }
  operator std::span<T>() noexcept { return span(); }
  operator std::span<const T>() const noexcept { return span(); }

 private:
  std::unique_ptr<T, free_deleter> data_;
  std::size_t size_ = 0;
};

/// Views any span of trivially copyable values as bytes.
template <class T>
std::span<const std::byte> as_bytes(std::span<T> values) noexcept {
  return std::as_bytes(values);
}
template <class T>
requires(!std::is_const_v<T>) std::span<std::byte> as_writable_bytes(std::span<T> values)
noexcept {
  return std::as_writable_bytes(values);
}

}  // namespace strata
