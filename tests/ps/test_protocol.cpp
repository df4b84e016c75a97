#include <catch2/catch.hpp>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "strata/compress/int8_block.hpp"
#include "strata/core/rng.hpp"
#include "strata/ps/consistency.hpp"
#include "strata/ps/layout.hpp"
#include "strata/ps/partition.hpp"
#include "strata/ps/protocol.hpp"

using namespace strata;
using namespace strata::ps;

namespace {

const shard_map map(layout::dedicated(2, 1), {{"a", 100, 4}, {"b", 0, 8}});

std::vector<std::byte> pull_message(std::vector<std::uint64_t> keys, std::uint32_t table = 0) {
  header h;
  h.type = msg_type::pull_request;
  h.worker = 1;
  h.table = table;
  h.step = 3;
  h.key_count = keys.size();
  h.dim = static_cast<std::uint32_t>(map.spec(table).dim);
  h.policy = sync::code;
  h.payload_bytes = keys.size() * 8;
  std::vector<std::byte> out;
  auto payload = start_message(out, h);
  std::memcpy(payload.data(), keys.data(), keys.size() * 8);
  return out;
}

std::vector<std::byte> push_message(std::vector<std::uint64_t> keys, bool int8) {
  header h;
  h.type = msg_type::push_request;
  h.worker = 1;
  h.table = 0;
  h.step = 3;
  h.key_count = keys.size();
  h.dim = 4;
  h.policy = sync::code;
  std::vector<float> grads(keys.size() * 4);
  for (std::size_t i = 0; i < grads.size(); ++i)
    grads[i] = static_cast<float>(i) * 0.25f - 1.0f;
  const compress::int8_block<8> codec;
  const std::size_t grad_bytes = int8 ? codec.max_encoded_bytes(grads.size()) : grads.size() * 4;
  h.codec = int8 ? wire_codec::compressed : wire_codec::fp32;
  h.payload_bytes = keys.size() * 8 + grad_bytes;
  std::vector<std::byte> out;
  auto payload = start_message(out, h);
  std::memcpy(payload.data(), keys.data(), keys.size() * 8);
  if (int8)
    codec.encode(grads, payload.subspan(keys.size() * 8));
  else
    std::memcpy(payload.data() + keys.size() * 8, grads.data(), grad_bytes);
  return out;
}

/// Decodes like a server would (including the int8 gradient decode); returns normally or
/// throws strata::error. Anything else (or a crash/ASan report) fails the test.
void server_side_decode(std::span<const std::byte> bytes) {
  const request r = decode_request(bytes, map, sync::code, 1);
  if (r.h.type == msg_type::push_request && r.h.codec == wire_codec::compressed) {
    std::vector<float> grads(r.keys.size() * r.h.dim);
    compress::int8_block<8>{}.decode(r.values, grads);
  }
}

errc code_of(std::span<const std::byte> bytes) {
  try {
    server_side_decode(bytes);
  } catch (const error& e) {
    return e.code();
  }
  return errc::internal;  // "no error"
}

}  // namespace

TEST_CASE("layouts place workers and servers", "[ps][layout]") {
  const auto d = layout::dedicated(3, 2);
  CHECK(d.ranks() == 5);
  CHECK(d.is_worker(2));
  CHECK_FALSE(d.is_worker(3));
  CHECK(d.is_server(3));
  CHECK(d.server_rank(1) == 4);
  CHECK(d.server_index(4) == 1);
  CHECK(d.worker_index(1) == 1);
  CHECK_THROWS_WITH(d.worker_index(4), Catch::Contains("rank 4 is not a worker"));
  CHECK_THROWS_AS(d.server_rank(2), error);
  CHECK_THROWS_WITH(d.check_size(4), Catch::Contains("needs a transport of 5 ranks"));
  const auto c = layout::colocated(3);
  CHECK(c.ranks() == 3);
  CHECK((c.is_worker(1) && c.is_server(1)));
  CHECK(c.server_rank(2) == 2);
  CHECK_THROWS_AS(layout::dedicated(0, 1), error);
}

TEST_CASE("partitions cover every server and agree between calls", "[ps][partition]") {
  // Range: contiguous, balanced.
  for (std::uint64_t k = 0; k < 100; ++k)
    CHECK(server_of(partition_kind::range, 0, 100, k, 4) == k / 25);
  // Hash: roughly balanced over 4 servers, different per table.
  std::vector<int> count(4, 0);
  int differ = 0;
  for (std::uint64_t k = 0; k < 4000; ++k) {
    const auto s = server_of(partition_kind::hash, 1, 0, k, 4);
    REQUIRE(s < 4);
    ++count[s];
    differ += s != server_of(partition_kind::hash, 2, 0, k, 4);
  }
  for (int c : count)
    CHECK((c > 850 && c < 1150));
  CHECK(differ > 2000);
  // Unbounded tables fall back to hash under range partitioning.
  CHECK(server_of(partition_kind::range, 1, 0, 123456789, 4) ==
        server_of(partition_kind::hash, 1, 0, 123456789, 4));
}

TEST_CASE("consistency policies state their facts", "[ps][consistency]") {
  STATIC_REQUIRE(consistency<ps::sync>);
  STATIC_REQUIRE(consistency<bounded<3>>);
  STATIC_REQUIRE(!consistency<int>);
  STATIC_REQUIRE(ps::sync::aggregates_step);
  STATIC_REQUIRE_FALSE(async::blocks_on_step);
  STATIC_REQUIRE(bounded<3>::max_staleness == 3);
  STATIC_REQUIRE(bounded<3>::code != bounded<4>::code);
}

TEST_CASE("valid messages round-trip", "[ps][protocol]") {
  const auto pull = pull_message({1, 5, 99});
  const request r = decode_request(pull, map, sync::code, 1);
  CHECK(r.h.type == msg_type::pull_request);
  CHECK(r.h.step == 3);
  CHECK(r.keys == std::vector<std::uint64_t>{1, 5, 99});
  REQUIRE_NOTHROW(server_side_decode(push_message({0, 7}, false)));
  REQUIRE_NOTHROW(server_side_decode(push_message({0, 7, 8}, true)));
  std::vector<std::byte> err;
  encode_error(err, 1, msg_type::push_request, 0, 3, errc::out_of_range, "boom");
  const header h = decode_header(err);
  const auto info = decode_error(h, err);
  CHECK(info.code == errc::out_of_range);
  CHECK(info.failed == msg_type::push_request);
  CHECK(info.text == "boom");
}

// Found by tests/fuzz/fuzz_protocol (corpus/protocol/regress-error-reply-diverged): decode_error
// refused code 10 (errc::diverged, added after errc::internal), so a server's error of that code
// reached the worker as "unknown error code 10" instead of its own message.
TEST_CASE("error replies carry every error code strata has", "[ps][protocol]") {
  for (int c = 0; c <= static_cast<int>(errc_last); ++c) {
    const auto code = static_cast<errc>(c);
    INFO(to_string(code));
    REQUIRE(to_string(code) != "unknown");
    std::vector<std::byte> err;
    encode_error(err, 1, msg_type::pull_request, 0, 3, code, to_string(code));
    const auto info = decode_error(decode_header(err), err);
    CHECK(info.code == code);
    CHECK(info.text == to_string(code));
  }
  std::vector<std::byte> err;
  encode_error(err, 1, msg_type::pull_request, 0, 3,
               static_cast<errc>(static_cast<int>(errc_last) + 1), "from the future");
  CHECK_THROWS_WITH(decode_error(decode_header(err), err),
                    Catch::Contains("unknown error code ") &&
                        Catch::Contains(std::to_string(static_cast<int>(errc_last) + 1)));
}

TEST_CASE("truncated messages are bad_message", "[ps][protocol]") {
  for (const auto& valid :
       {pull_message({1, 5, 99}), push_message({0, 7}, false), push_message({2, 3, 4}, true)}) {
    for (std::size_t len = 0; len < valid.size(); ++len) {
      INFO("length " << len << " of " << valid.size());
      CHECK(code_of(std::span(valid).first(len)) == errc::bad_message);
    }
    auto longer = valid;
    longer.push_back(std::byte{0});
    CHECK(code_of(longer) == errc::bad_message);
  }
}

TEST_CASE("edited fields are caught, never read out of bounds", "[ps][protocol]") {
  const counter_rng rng{3, 4};
  std::uint64_t draw = 0;
  for (const auto& valid : {pull_message({1, 5, 99}), pull_message({1, 1ull << 40}, 1),
                            push_message({0, 7}, false), push_message({2, 3, 4}, true)}) {
    for (std::size_t pos = 0; pos < valid.size(); ++pos)
      for (const unsigned value :
           {0x00u, 0x01u, 0x7fu, 0x80u, 0xffu, static_cast<unsigned>(rng.bits(draw++) & 0xffu)}) {
        auto edited = valid;
        edited[pos] = static_cast<std::byte>(value);
        INFO("byte " << pos << " set to " << int(value));
        const errc code = code_of(edited);
        CHECK((code == errc::bad_message || code == errc::internal /* still valid */));
      }
  }
  // Specific fields name what is wrong.
  auto m = pull_message({1, 2});
  m[0] = std::byte{0};
  CHECK_THROWS_WITH(server_side_decode(m), Catch::Contains("bad magic"));
  m = pull_message({1, 2});
  m[12] = std::byte{9};  // table 9
  CHECK_THROWS_WITH(server_side_decode(m), Catch::Contains("table 9 outside the 2 tables"));
  m = pull_message({1, 2});
  m[32] = std::byte{5};  // dim 5
  CHECK_THROWS_WITH(server_side_decode(m), Catch::Contains("dim 5 but table 0"));
  m = pull_message({1, 2});
  m[36] = std::byte{2};  // async's code
  CHECK_THROWS_WITH(server_side_decode(m), Catch::Contains("consistency code 2"));
  CHECK_THROWS_WITH(server_side_decode(pull_message({2, 1})),
                    Catch::Contains("not strictly ascending"));
  CHECK_THROWS_WITH(server_side_decode(pull_message({1, 100})),
                    Catch::Contains("key 100 of table 0 'a' is outside its rows [0, 100)"));
  m = pull_message({1, 2});
  m[24] = std::byte{0xff};  // key count 255
  CHECK_THROWS_WITH(server_side_decode(m), Catch::Contains("key count 255"));
  m = pull_message({1, 2});
  m[8] = std::byte{0};  // worker 0 but sent by worker 1
  CHECK_THROWS_WITH(server_side_decode(m), Catch::Contains("names worker 0"));
}

TEST_CASE("random bytes are bad_message", "[ps][protocol]") {
  const counter_rng rng{8, 9};
  std::uint64_t draw = 0;
  const auto valid = pull_message({1, 5, 99});
  for (int trial = 0; trial < 3000; ++trial) {
    std::vector<std::byte> junk(rng.below(draw++, 120));
    for (auto& b : junk)
      b = static_cast<std::byte>(rng.bits(draw++));
    // Half the trials keep a valid prefix so decoding gets past the magic.
    if (trial % 2 == 1 && junk.size() >= 8) std::memcpy(junk.data(), valid.data(), 8);
    const errc code = code_of(junk);
    CHECK((code == errc::bad_message || code == errc::internal));
  }
}
