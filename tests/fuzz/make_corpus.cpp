// Writes the seed corpora of the fuzz targets (tests/fuzz/corpus/<target>/): a few small valid
// and near-valid inputs each, in the input format the target's header comment describes,
// built with strata's own writers (ps::start_message, checkpoint_writer, row_records,
// ctr_vocabulary::save) so they
// stay valid when a format changes. Deterministic: rerunning it rewrites the same bytes.
//   cmake --build build-fuzz --target fuzz_make_corpus
//   build-fuzz/tests/fuzz/fuzz_make_corpus tests/fuzz/corpus
#include <zlib.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <span>
#include <string>
#include <vector>

#include "strata/compress/fp16.hpp"
#include "strata/compress/int8_block.hpp"
#include "strata/compress/topk.hpp"
#include "strata/core/checksum.hpp"
#include "strata/data/ctr_vocabulary.hpp"
#include "strata/ps/consistency.hpp"
#include "strata/ps/partition.hpp"
#include "strata/ps/protocol.hpp"
#include "strata/train/checkpoint.hpp"
#include "strata/train/checkpoint_rows.hpp"

namespace {

namespace fs = std::filesystem;
using namespace strata;
using bytes = std::vector<std::uint8_t>;

fs::path root;

void emit(const std::string& target, const std::string& name, const bytes& content) {
  const fs::path dir = root / target;
  fs::create_directories(dir);
  std::ofstream out(dir / name, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(content.data()),
            static_cast<std::streamsize>(content.size()));
  if (!out) fail(errc::io_error, cat("make_corpus: cannot write ", (dir / name).string()));
}

bytes operator+(bytes a, const bytes& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}
bytes text(const std::string& s) {
  return {s.begin(), s.end()};
}
template <class T>
bytes raw(const T& v) {
  bytes out(sizeof(T));
  std::memcpy(out.data(), &v, sizeof(T));
  return out;
}
bytes raw_span(std::span<const std::byte> s) {
  const auto* p = reinterpret_cast<const std::uint8_t*>(s.data());
  return {p, p + s.size()};
}

bytes gzip(const bytes& in) {
  z_stream z{};
  deflateInit2(&z, Z_BEST_SPEED, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY);
  bytes out(deflateBound(&z, in.size()) + 32);
  z.next_in = const_cast<Bytef*>(in.data());
  z.avail_in = static_cast<uInt>(in.size());
  z.next_out = out.data();
  z.avail_out = static_cast<uInt>(out.size());
  deflate(&z, Z_FINISH);
  out.resize(z.total_out);
  deflateEnd(&z);
  return out;
}

// ---- criteo --------------------------------------------------------------------------------

/// A 40-field line: label, I1..I13 = i * seed (I2 = -1), C1..C26 = hex of (j + 1) * seed.
std::string criteo_line(int label, unsigned seed) {
  std::string line = std::to_string(label);
  for (unsigned i = 1; i <= 13; ++i)
    line += "\t" + (i == 2 ? std::string("-1") : std::to_string(i * seed));
  char hex[20];
  for (unsigned j = 0; j < 26; ++j) {
    std::snprintf(hex, sizeof hex, "%x", (j + 1) * seed * 2654435761u);
    line += "\t" + std::string(hex);
  }
  return line;
}

void criteo() {
  const std::string a = criteo_line(1, 3), b = criteo_line(0, 7);
  std::string missing = "0";  // every field empty
  for (int f = 0; f < 39; ++f)
    missing += "\t";
  // settings: bits 0-1 table_rows, 2 hash seed, 3 skip, 4-5 max line, 6-7 (3 = whole reader)
  const std::uint8_t parser = 0x30;  // {2^20} rows, lines up to 2^16
  emit("criteo", "lines-valid", bytes{parser} + text(a + "\n" + b + "\n"));
  emit("criteo", "lines-crlf-missing-fields",
       bytes{static_cast<std::uint8_t>(parser | 2 | 4)} + text(a + "\r\n" + missing + "\r\n"));
  emit(
      "criteo", "lines-bad-hex-label-columns",
      bytes{static_cast<std::uint8_t>(parser | 3)} +
          text(a + "\t11111111111111111\n2" + b.substr(1) + "\n" + b.substr(2) + "\n" + "1\t\t\n"));
  emit("criteo", "lines-bad-integer",
       bytes{parser} + text("1\t99999999999999999999" + a.substr(a.find('\t', 2)) + "\n"));
  // Whole reader: second byte = chunk_rows 1-4 (bits 0-1), prefetch 1-2 (bit 2), batch 1-8.
  emit("criteo", "reader-valid", bytes{0xF0, 0x0D} + text(a + "\n" + b + "\n" + a));
  emit("criteo", "reader-skip-bad-and-overlong",  // lines up to 300 bytes
       bytes{0xC8 | 0x20, 0x09} + text(a + "\n" + std::string(1000, 'x') + "\n" + b + "\nnope\n"));
  emit("criteo", "reader-bad-line-stops", bytes{0xF1, 0x00} + text(a + "\n1\t2\n" + b + "\n"));
}

// ---- idx -----------------------------------------------------------------------------------

bytes idx(std::uint32_t magic, const std::vector<std::uint32_t>& dims, const bytes& values) {
  bytes out;
  const auto be = [&](std::uint32_t v) {
    for (int shift = 24; shift >= 0; shift -= 8)
      out.push_back(static_cast<std::uint8_t>(v >> shift));
  };
  be(magic);
  for (const auto d : dims)
    be(d);
  return out + values;
}

void idx_corpus() {
  // settings: bits 0-2 rank (% 5), 3 gzip, 4 fashion, 5 normalize, 6 test split
  emit("idx", "labels-raw", bytes{1} + idx(0x801, {3}, {0, 1, 9}));
  emit("idx", "images-gzipped-by-harness", bytes{3 | 8} + idx(0x803, {2, 2, 2}, bytes(8, 200)));
  emit("idx", "images-gzip-file", bytes{3} + gzip(idx(0x803, {1, 3, 2}, {1, 2, 3, 4, 5, 6})));
  emit("idx", "rank0", bytes{0} + idx(0x800, {}, {42}));
  emit("idx", "rank4", bytes{4} + idx(0x804, {1, 2, 1, 2}, {1, 2, 3, 4}));
  emit("idx", "truncated-data", bytes{1} + idx(0x801, {10}, {1, 2, 3, 4}));
  emit("idx", "trailing-byte", bytes{2 | 8} + idx(0x802, {2, 2}, {1, 2, 3, 4, 5}));
  emit("idx", "huge-dimensions", bytes{2} + idx(0x802, {65536, 65536}, {1}));
  bytes pixels(2 * 784);
  for (std::size_t i = 0; i < pixels.size(); ++i)
    pixels[i] = static_cast<std::uint8_t>(i * 7);
  const bytes images = idx(0x803, {2, 28, 28}, pixels), labels = idx(0x801, {2}, {1, 9});
  const auto n = static_cast<std::uint16_t>(images.size());
  emit("idx", "fashion-gz", bytes{16 | 8 | 32} + raw(n) + images + labels);
  emit("idx", "fashion-test-bad-label",
       bytes{16 | 64} + raw(n) + images + idx(0x801, {2}, {1, 10}));
}

// ---- protocol ------------------------------------------------------------------------------

bytes message(const ps::header& h, const bytes& payload) {
  ps::header copy = h;
  copy.payload_bytes = payload.size();
  std::vector<std::byte> out;
  const auto p = ps::start_message(out, copy);
  if (!payload.empty()) std::memcpy(p.data(), payload.data(), payload.size());
  return raw_span(out);
}

bytes keys_bytes(const std::vector<std::uint64_t>& keys) {
  bytes out;
  for (const auto k : keys)
    out = out + raw(k);
  return out;
}

template <class Codec>
bytes encoded(const Codec& codec, const std::vector<float>& values) {
  std::vector<std::byte> out(codec.max_encoded_bytes(values.size()));
  Codec copy = codec;
  out.resize(copy.encode(values, out));
  return raw_span(out);
}

/// A scripted reply: u16 length, then the message.
bytes scripted(const bytes& m) {
  return raw(static_cast<std::uint16_t>(m.size())) + m;
}

void protocol() {
  // Server side: byte 0 = 0, shape, who, message. Shape 0 (who 1: worker 1, no row shift):
  // one unbounded table of dim 1, one server, hash, sync, identity codec.
  ps::header h;
  h.worker = 1;
  h.policy = ps::sync::code;
  h.dim = 1;
  h.type = ps::msg_type::pull_request;
  h.key_count = 3;
  emit("protocol", "server-pull", bytes{0, 0, 1} + message(h, keys_bytes({1, 5, 9})));
  h.codec = ps::wire_codec::fp16;
  emit("protocol", "server-pull-fp16", bytes{0, 0, 1} + message(h, keys_bytes({1, 5, 9})));
  h.codec = ps::wire_codec::fp32;
  h.type = ps::msg_type::push_request;
  h.key_count = 2;
  emit("protocol", "server-push-fp32",
       bytes{0, 0, 1} + message(h, keys_bytes({2, 4}) + raw(1.5f) + raw(-2.0f)));
  h.codec = ps::wire_codec::compressed;
  const std::vector<float> grads = {0.25f, -3.0f};
  emit("protocol", "server-push-fp16",
       bytes{0, 0x40, 1} + message(h, keys_bytes({2, 4}) + encoded(compress::fp16{}, grads)));
  emit("protocol", "server-push-int8",
       bytes{0, 0x80, 1} +
           message(h, keys_bytes({2, 4}) + encoded(compress::int8_block<4>{}, grads)));
  emit("protocol", "server-push-topk",
       bytes{0, 0xC0, 1} + message(h, keys_bytes({2, 4}) + encoded(compress::topk(0.5), grads)));
  // Shape 2 | 0x10, who 3: tables t0 (rows 0, dim 1), t1 (rows 10, dim 3), t2 (rows 1000,
  // dim 8), async, worker 3.
  ps::header p2;
  p2.worker = 3;
  p2.policy = ps::async::code;
  p2.table = 2;
  p2.dim = 8;
  p2.key_count = 2;
  emit("protocol", "server-pull-table2", bytes{0, 2 | 0x10, 3} + message(p2, keys_bytes({0, 999})));
  ps::header bye;
  bye.type = ps::msg_type::shutdown;
  bye.worker = 1;
  bye.policy = ps::sync::code;
  emit("protocol", "server-shutdown", bytes{3, 0, 1} + message(bye, {}));

  // Worker side: byte 0 = 1, shape (bit 0: 2 servers, bit 1: fp16 pulls, bits 2-3: dim
  // {1, 2, 4, 3}, bit 4: 100 rows, bit 5: range partition, bits 6-7: pull / shutdown only /
  // two tables / push then pull), then the scripted replies. Keys 7 3 7 42 3 99.
  const std::vector<std::uint64_t> unique = {3, 7, 42, 99};
  ps::header ack;
  ack.type = ps::msg_type::shutdown_ack;
  const auto reply = [&](std::uint32_t table, std::uint64_t step, std::size_t keys,
                         std::uint32_t dim, bool half) {
    ps::header r;
    r.type = ps::msg_type::pull_reply;
    r.codec = half ? ps::wire_codec::fp16 : ps::wire_codec::fp32;
    r.table = table;
    r.step = step;
    r.key_count = keys;
    r.dim = dim;
    std::vector<float> rows(keys * dim);
    for (std::size_t i = 0; i < rows.size(); ++i)
      rows[i] = 0.5f * static_cast<float>(i) - 1.0f;
    return message(
        r, half ? encoded(compress::fp16{}, rows) : raw_span(std::as_bytes(std::span(rows))));
  };
  emit("protocol", "worker-pull",
       bytes{1, 0x00} + scripted(reply(0, 0, 4, 1, false)) + scripted(message(ack, {})));
  emit("protocol", "worker-pull-fp16-dim4",
       bytes{1, 0x02 | 0x08} + scripted(reply(0, 0, 4, 4, true)) + scripted(message(ack, {})));
  {
    // Two servers, hash partition, dim 2: each server answers its share of the keys.
    const ps::shard_map map(ps::layout::dedicated(1, 2), {{"a", 0, 2}, {"b", 0, 2}});
    std::size_t share[2] = {0, 0};
    for (const auto k : unique)
      ++share[map.server_of(0, k)];
    bytes script = {1, 0x01 | 0x04};
    for (std::size_t s = 0; s < 2; ++s)
      if (share[s] > 0) script = script + scripted(reply(0, 0, share[s], 2, false));
    emit("protocol", "worker-pull-two-servers",
         script + scripted(message(ack, {})) + scripted(message(ack, {})));
  }
  emit("protocol", "worker-two-tables",
       bytes{1, 0x80 | 0x04} + scripted(reply(1, 0, 4, 2, false)) +
           scripted(reply(0, 0, 4, 2, false)) + scripted(message(ack, {})));
  emit("protocol", "worker-push-then-pull",
       bytes{1, 0xC0 | 0x10} + scripted(reply(0, 1, 4, 1, false)) + scripted(message(ack, {})));
  std::vector<std::byte> err;
  ps::encode_error(err, 0, ps::msg_type::push_request, 0, 0, errc::out_of_range, "key 7 is bad");
  std::vector<std::byte> err_bye;
  ps::encode_error(err_bye, 0, ps::msg_type::shutdown, 0, 0, errc::bad_message, "late");
  emit("protocol", "worker-shutdown-errors",
       bytes{1, 0x40} + scripted(raw_span(err)) + scripted(raw_span(err_bye)));

  // Messages: byte 0 = 2, an error code, a request type, then one message.
  emit("protocol", "message-error-reply", bytes{2, 5, 3} + raw_span(err));
  emit("protocol", "message-pull-reply", bytes{2, 0, 1} + reply(4, 9, 2, 3, false));
  emit("protocol", "message-short", bytes{2, 9, 6} + text("SPS1\x01"));
}

// ---- checkpoint ----------------------------------------------------------------------------

bytes read_all(const fs::path& file) {
  std::ifstream in(file, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}
bytes without_checksum(bytes b) {
  b.resize(b.size() - 8);
  return b;
}

/// A file target's four seeds from one valid file: `<prefix>valid` as written (settings byte
/// 0), `checksum-appended` without its checksum for the target to append (1), `truncated` to
/// half (0) and `bad-version` with byte 8 (the version after an 8-byte magic) set to 2 (1).
void emit_file_seeds(const std::string& target, const std::string& prefix, const bytes& file) {
  emit(target, prefix + "valid", bytes{0} + file);
  emit(target, prefix + "checksum-appended", bytes{1} + without_checksum(file));
  bytes truncated = file;
  truncated.resize(truncated.size() / 2);
  emit(target, prefix + "truncated", bytes{0} + truncated);
  bytes version = file;
  version[8] = 2;
  emit(target, prefix + "bad-version", bytes{1} + without_checksum(version));
}

void checkpoint(const fs::path& scratch) {
  // settings: bit 0 append checksum, bits 1-2 reader (0-1 sections, 2 meta, 3 rows + shape)
  train::checkpoint_writer w;
  w.add_value<std::uint64_t>("step", 12);
  const std::vector<float> dense = {1.0f, -2.0f, 3.5f};
  w.add_values<float>("dense", dense);
  w.add("empty", {});
  w.commit(scratch / "plain.ckpt");
  emit_file_seeds("checkpoint", "sections-", read_all(scratch / "plain.ckpt"));

  train::checkpoint_meta meta;
  meta.step = 100;
  meta.dense_count = 7;
  meta.dense_row = 7;
  meta.seed = 42;
  meta.workers = 2;
  meta.optimizer = "adagrad";
  meta.dense_optimizer = "adam";
  meta.strategy = "hybrid";
  meta.tables = "user 1000 16\nitem 500 16";
  meta.files = {"rows-0.ckpt", "worker-0.ckpt"};
  meta.write(scratch / "state.ckpt");
  const bytes state = read_all(scratch / "state.ckpt");
  emit("checkpoint", "meta-valid", bytes{4} + state);
  emit("checkpoint", "meta-checksum-appended", bytes{4 | 1} + without_checksum(state));

  // Rows: shape byte 11 = 2 tables, dim 2, 1 state float per row.
  train::row_records records(2);
  const float r0[] = {1.0f, 2.0f}, r1[] = {-1.0f, 0.5f}, s0[] = {0.25f};
  records.add(0, 5, r0, s0);
  records.add(0, 9, r1, s0);
  records.add(1, 0, r1, s0);
  records.commit(scratch / "rows.ckpt");
  const bytes rows = read_all(scratch / "rows.ckpt");
  emit("checkpoint", "rows-valid", bytes{6, 11} + rows);
  emit("checkpoint", "rows-checksum-appended", bytes{6 | 1, 11} + without_checksum(rows));
  emit("checkpoint", "rows-other-shape", bytes{6 | 1, 3} + without_checksum(rows));
}

// ---- vocabulary ----------------------------------------------------------------------------

void vocabulary(const fs::path& scratch) {
  // settings: bit 0 append the checksum
  data::ctr_key_counts counts({50, 1000, std::uint64_t{1} << 27});
  for (std::uint64_t i = 0; i < 400; ++i) {
    counts.add(0, i % 50);
    counts.add(1, (i * i) % 1000);
    counts.add(2, (i * 7919) % 3001);
  }
  const data::ctr_vocabulary v(counts, {.min_count = 2,
                                        .hash_seed = 7,
                                        .examples = 400,
                                        .counted_files = {"day_0.ctrb", "day_1.ctrb"}});
  v.save(scratch / "v.ctrv");
  emit_file_seeds("vocabulary", "", read_all(scratch / "v.ctrv"));
  // A header asking for 4096 tables of 2^26 hashed rows and no key: must not allocate them.
  bytes lying = text("STRATACV") + raw(std::uint32_t{1}) + raw(std::uint32_t{4096}) +
                raw(std::uint64_t{1}) + raw(std::uint64_t{0}) + raw(std::uint64_t{0}) +
                raw(std::uint32_t{0});
  for (int t = 0; t < 4096; ++t)
    lying = lying + raw(std::uint64_t{1} << 26) + raw(std::uint64_t{0});
  emit("vocabulary", "huge-tables-no-keys", bytes{1} + lying);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s CORPUS_ROOT (tests/fuzz/corpus)\n", argv[0]);
    return 2;
  }
  root = argv[1];
  const fs::path scratch = fs::temp_directory_path() / "strata-make-corpus";
  fs::create_directories(scratch);
  try {
    criteo();
    idx_corpus();
    protocol();
    checkpoint(scratch);
    vocabulary(scratch);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "make_corpus: %s\n", e.what());
    fs::remove_all(scratch);
    return 1;
  }
  fs::remove_all(scratch);
  std::printf("seed corpora written under %s\n", root.c_str());
  return 0;
}
