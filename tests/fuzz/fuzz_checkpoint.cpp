// libFuzzer target: the checkpoint readers (strata/train/checkpoint.hpp, checkpoint_rows.hpp).
//
// The readers only take paths, so the bytes are written to memory, never to disk:
// checkpoint_reader and checkpoint_meta::read open an in-memory file (memfd,
// /proc/self/fd/N), read_row_records a folder under /dev/shm holding it as rows-0.ckpt.
//
// Input: one settings byte, then the file bytes.
//   bit  0    append the right checksum to the bytes (a random file almost never carries one,
//             so without this the fuzzer would rarely get past the checksum to what
//             checkpoint_meta::read and read_row_records do with the sections)
//   bits 1-2  0-1: checkpoint_reader and its accessors; 2: checkpoint_meta::read;
//             3: read_row_records, shapes from a second byte: 1-2 tables (bit 0), dim 1-4
//             (bits 1-2), 0-1 optimizer-state floats per row (bit 3)
// Oracles: an accepted file holds as many sections as its header counts (the sections are
// what the file says, nothing dropped or merged); accessors agree with the section sizes;
// records have the shapes asked for; a refusal is corrupt_data.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "strata/train/checkpoint.hpp"
#include "strata/train/checkpoint_rows.hpp"

#include "support.hpp"

namespace {

using namespace strata;
using namespace strata::train;

void read_sections(const std::string& path, std::span<const std::uint8_t> bytes) {
  const checkpoint_reader in(path);
  std::uint32_t count = 0;
  std::memcpy(&count, bytes.data() + 12, 4);  // accepted: the 16-byte preamble is there
  const auto names = in.section_names();
  strata_fuzz::require(names.size() == count,
                       "checkpoint_reader: accepted a file whose sections it does not all hold "
                       "(a section name appears twice?)");
  for (const auto& name : names) {
    strata_fuzz::require(in.has(name), "checkpoint_reader: has() disagrees with section_names()");
    const std::size_t size = in.bytes(name).size();
    try {
      strata_fuzz::require(in.values<std::uint64_t>(name).size() * 8 == size,
                           "checkpoint_reader: values<u64> lost bytes");
    } catch (const error& e) {
      strata_fuzz::expect_code(e, {errc::corrupt_data});
      strata_fuzz::require(size % 8 != 0, "checkpoint_reader: values<u64> refused 8k bytes");
    }
  }
}

void read_meta(const std::string& path) {
  const checkpoint_meta meta = checkpoint_meta::read(path);
  for (const auto& name : meta.files)
    strata_fuzz::require(!name.empty() && name.find('\n') == std::string::npos,
                         "checkpoint_meta: an empty or multi-line file name");
}

void read_rows(const strata_fuzz::scratch_dir& dir, std::span<const std::uint8_t> bytes,
               unsigned shape) {
  dir.write("rows-0.ckpt", bytes);
  std::vector<row_shape> shapes(1 + (shape & 1u));
  for (auto& s : shapes)
    s = {1 + ((shape >> 1) & 3u), (shape >> 3) & 1u};
  read_row_records(dir.path(), shapes,
                   [&](std::size_t table, std::uint64_t, std::span<const float> row,
                       std::span<const float> state, const std::filesystem::path&) {
                     strata_fuzz::require(table < shapes.size() &&
                                              row.size() == shapes[table].dim &&
                                              state.size() == shapes[table].state_floats,
                                          "read_row_records: a record of the wrong shape");
                   });
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static strata_fuzz::memory_file file;
  static strata_fuzz::scratch_dir dir;
  strata_fuzz::input in(data, size);
  const unsigned settings = in.u8();
  const unsigned reader = (settings >> 1) & 3u;
  const unsigned shape = reader == 3 ? in.u8() : 0;
  const auto rest = in.rest();
  std::vector<std::uint8_t> bytes(rest.begin(), rest.end());
  if ((settings & 1u) != 0) {
    train::detail::checksum64 sum;
    sum.update(std::as_bytes(std::span(bytes)));
    const std::uint64_t value = sum.value();
    const auto* p = reinterpret_cast<const std::uint8_t*>(&value);
    bytes.insert(bytes.end(), p, p + 8);
  }
  try {
    if (reader <= 1) {
      read_sections(file.write(bytes), bytes);
    } else if (reader == 2) {
      read_meta(file.write(bytes));
    } else {
      read_rows(dir, bytes, shape);
    }
    strata_fuzz::note("accepted");
  } catch (const error& e) {
    strata_fuzz::expect_code(e, {errc::corrupt_data});
  }
  return 0;
}
