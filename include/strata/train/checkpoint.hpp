/// @file checkpoint.hpp
/// Checkpoint files: named sections of bytes, a checksum over everything, written atomically
/// (temporary file + fsync + rename) so a crash mid-write leaves the previous checkpoint intact.
///
/// Layout (little-endian): "STRATACK" | u32 version | u32 sections |
/// per section: u32 name length, name, u64 payload length, payload | u64 checksum of all
/// preceding bytes. Readers validate every length against the file size before using it.
#pragma once

#include <fcntl.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "strata/core/error.hpp"

namespace strata::train {

namespace detail {
/// 64-bit checksum, 8 bytes per round (a multiply-xorshift chain; not cryptographic, but any
/// flipped bit or truncation changes it).
class checksum64 {
 public:
  void update(std::span<const std::byte> bytes) noexcept {
    for (std::byte b : bytes) {
      pending_ |= std::uint64_t(std::to_integer<std::uint8_t>(b)) << (8 * filled_);
      if (++filled_ == 8) flush();
    }
    length_ += bytes.size();
  }
  [[nodiscard]] std::uint64_t value() const noexcept {
    checksum64 copy = *this;
    copy.pending_ ^= std::uint64_t(copy.filled_) << 56;
    copy.flush();
    std::uint64_t h = copy.state_ ^ copy.length_;
    h ^= h >> 33;
    h *= 0xFF51AFD7ED558CCDull;
    h ^= h >> 33;
    return h;
  }

 private:
  void flush() noexcept {
    state_ = (state_ ^ (pending_ * 0x9E3779B97F4A7C15ull)) * 0xC2B2AE3D27D4EB4Full;
    state_ ^= state_ >> 29;
    pending_ = 0;
    filled_ = 0;
  }
  std::uint64_t state_ = 0x243F6A8885A308D3ull;
  std::uint64_t pending_ = 0;
  std::uint64_t length_ = 0;
  unsigned filled_ = 0;
};
inline constexpr char checkpoint_magic[8] = {'S', 'T', 'R', 'A', 'T', 'A', 'C', 'K'};
inline constexpr std::uint32_t checkpoint_version = 1;
}  // namespace detail

/// Collects named sections in memory, then writes them atomically with commit().
class checkpoint_writer {
 public:
  void add(const std::string& name, std::span<const std::byte> bytes) {
    STRATA_EXPECTS(!sections_.contains(name), "checkpoint: section '", name, "' added twice");
    sections_[name].assign(bytes.begin(), bytes.end());
  }
  template <class T>
  requires std::is_trivially_copyable_v<T>
  void add_values(const std::string& name, std::span<const T> values) {
    add(name, std::as_bytes(values));
  }
  template <class T>
  requires std::is_trivially_copyable_v<T>
  void add_value(const std::string& name, const T& value) {
    add(name, std::as_bytes(std::span(&value, 1)));
  }

  /// Writes `path` atomically: `path.tmp` is written and fsynced, then renamed over `path`.
  void commit(const std::filesystem::path& path) const {
    const auto temporary = std::filesystem::path(path.string() + ".tmp");
    {
      std::ofstream out(temporary, std::ios::binary | std::ios::trunc);
      if (!out)
        fail(errc::io_error, cat("checkpoint: cannot write ", temporary.string(),
                                 "; does the directory exist and is it writable?"));
      detail::checksum64 sum;
      const auto put = [&](const void* data, std::size_t size) {
        const auto bytes = std::span(static_cast<const std::byte*>(data), size);
        sum.update(bytes);
        out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(size));
      };
      put(detail::checkpoint_magic, sizeof detail::checkpoint_magic);
      const std::uint32_t version = detail::checkpoint_version;
      const auto count = static_cast<std::uint32_t>(sections_.size());
      put(&version, sizeof version);
      put(&count, sizeof count);
      for (const auto& [name, payload] : sections_) {
        const auto name_size = static_cast<std::uint32_t>(name.size());
        const std::uint64_t payload_size = payload.size();
        put(&name_size, sizeof name_size);
        put(name.data(), name.size());
        put(&payload_size, sizeof payload_size);
        put(payload.data(), payload.size());
      }
      const std::uint64_t checksum = sum.value();
      out.write(reinterpret_cast<const char*>(&checksum), sizeof checksum);
      out.flush();
      if (!out)
        fail(errc::io_error,
             cat("checkpoint: writing ", temporary.string(), " failed (disk full?)"));
    }
    sync_file(temporary);
    std::error_code ec;
    std::filesystem::rename(temporary, path, ec);
    if (ec)
      fail(errc::io_error, cat("checkpoint: cannot rename ", temporary.string(), " to ",
                               path.string(), ": ", ec.message()));
  }

 private:
  static void sync_file(const std::filesystem::path& path) {
    const int fd = ::open(path.c_str(), O_RDONLY);
    if (fd >= 0) {
      ::fsync(fd);
      ::close(fd);
    }
  }
  std::map<std::string, std::vector<std::byte>> sections_;
};

/// What identifies one written checkpoint file without reading it whole: its size and the
/// checksum stored in its last 8 bytes (a state.ckpt records them for every other file).
struct file_seal {
  std::uint64_t bytes = 0;
  std::uint64_t checksum = 0;
  friend bool operator==(const file_seal&, const file_seal&) = default;
};
/// The seal of the checkpoint file `path` (errc::io_error when it cannot be read; a file too
/// short to hold a checksum gives checksum 0 — its reader refuses it anyway).
inline file_seal seal_of(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) fail(errc::io_error, cat("checkpoint: cannot open ", path.string()));
  file_seal seal;
  seal.bytes = static_cast<std::uint64_t>(in.tellg());
  if (seal.bytes >= sizeof seal.checksum) {
    in.seekg(-static_cast<std::streamoff>(sizeof seal.checksum), std::ios::end);
    in.read(reinterpret_cast<char*>(&seal.checksum), sizeof seal.checksum);
    if (!in) fail(errc::io_error, cat("checkpoint: cannot read ", path.string()));
  }
  return seal;
}

/// Reads and validates a whole checkpoint (magic, version, every length, unique section names,
/// checksum) on construction; a damaged file raises `errc::corrupt_data` naming the file and the
/// problem.
class checkpoint_reader {
 public:
  explicit checkpoint_reader(const std::filesystem::path& path) : path_(path) {
    std::ifstream in(path, std::ios::binary | std::ios::ate);
    if (!in) fail(errc::io_error, cat("checkpoint: cannot open ", path.string()));
    std::vector<std::byte> file(static_cast<std::size_t>(in.tellg()));
    in.seekg(0);
    in.read(reinterpret_cast<char*>(file.data()), static_cast<std::streamsize>(file.size()));
    if (!in) fail(errc::io_error, cat("checkpoint: cannot read ", path.string()));
    std::size_t at = 0;
    const auto take = [&](std::size_t size, const char* field) {
      if (file.size() - at < size)
        corrupt(cat("truncated in ", field, " at byte ", at, " of ", file.size()));
      const auto piece = std::span<const std::byte>(file.data() + at, size);
      at += size;
      return piece;
    };
    const auto take_u32 = [&](const char* field) {
      std::uint32_t v;
      std::memcpy(&v, take(4, field).data(), 4);
      return v;
    };
    const auto take_u64 = [&](const char* field) {
      std::uint64_t v;
      std::memcpy(&v, take(8, field).data(), 8);
      return v;
    };
    if (file.size() < sizeof detail::checkpoint_magic + 16)
      corrupt(cat("file of ", file.size(), " bytes is too short to be a checkpoint"));
    if (std::memcmp(take(8, "magic").data(), detail::checkpoint_magic, 8) != 0)
      corrupt("bad magic (not a strata checkpoint)");
    const auto version = take_u32("version");
    if (version != detail::checkpoint_version)
      corrupt(cat("version ", version, " is not supported (expected ", detail::checkpoint_version,
                  ")"));
    const auto count = take_u32("section count");
    for (std::uint32_t s = 0; s < count; ++s) {
      const auto name_size = take_u32("section name length");
      if (name_size > 4096) corrupt(cat("section ", s, " has a name of ", name_size, " bytes"));
      const auto name_bytes = take(name_size, "section name");
      std::string name(reinterpret_cast<const char*>(name_bytes.data()), name_size);
      const auto payload_size = take_u64("section length");
      if (payload_size > file.size() - at)
        corrupt(cat("truncated: section '", name, "' claims ", payload_size, " bytes but only ",
                    file.size() - at, " remain"));
      const auto payload = take(static_cast<std::size_t>(payload_size), "section payload");
      // The writer names each section once; a second one would silently replace the first.
      if (!sections_.try_emplace(name, payload.begin(), payload.end()).second)
        corrupt(cat("section '", name, "' appears twice (again as section ", s, " of ", count,
                    "); a strata checkpoint names each section once"));
    }
    detail::checksum64 sum;
    sum.update(std::span<const std::byte>(file.data(), at));
    const auto stored = take_u64("checksum");
    if (at != file.size()) corrupt(cat(file.size() - at, " unexpected bytes after the checksum"));
    if (stored != sum.value()) corrupt("checksum mismatch (the file is damaged)");
  }

  [[nodiscard]] const std::filesystem::path& path() const noexcept { return path_; }
  [[nodiscard]] bool has(const std::string& name) const { return sections_.contains(name); }
  [[nodiscard]] std::span<const std::byte> bytes(const std::string& name) const {
    const auto found = sections_.find(name);
    if (found == sections_.end())
      fail(errc::corrupt_data, cat("checkpoint ", path_.string(), " has no section '", name, "'"));
    return found->second;
  }
  /// Section `name` as values of T; its size must be a multiple of sizeof(T) (and equal
  /// `expected_count` when given).
  template <class T>
  requires std::is_trivially_copyable_v<T> std::vector<T> values(
      const std::string& name, std::size_t expected_count = SIZE_MAX)
  const {
    const auto raw = bytes(name);
    if (raw.size() % sizeof(T) != 0 ||
        (expected_count != SIZE_MAX && raw.size() != expected_count * sizeof(T)))
      fail(errc::corrupt_data,
           cat("checkpoint ", path_.string(), ": section '", name, "' has ", raw.size(),
               " bytes, expected ", expected_count == SIZE_MAX ? 0 : expected_count, " values of ",
               sizeof(T), " bytes (was it written for another model configuration?)"));
    std::vector<T> out(raw.size() / sizeof(T));
    if (!out.empty()) std::memcpy(out.data(), raw.data(), raw.size());
    return out;
  }
  template <class T>
  T value(const std::string& name) const {
    return values<T>(name, 1)[0];
  }
  [[nodiscard]] std::vector<std::string> section_names() const {
    std::vector<std::string> names;
    for (const auto& entry : sections_)
      names.push_back(entry.first);
    return names;
  }

 private:
  [[noreturn]] void corrupt(const std::string& what) const {
    fail(errc::corrupt_data, cat("checkpoint ", path_.string(), ": ", what,
                                 "; the previous checkpoint (if any) is untouched"));
  }
  std::filesystem::path path_;
  std::map<std::string, std::vector<std::byte>> sections_;
};

}  // namespace strata::train
