// strata::cli: the values ctr_train, resnet_train and the benches accept, and the refusals
// (issue 15's probes: 1e10 workers, 4294967297, 2^63 batches, NaN / negative / zero links).
#include <catch2/catch.hpp>

#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include <cstdint>
#include <limits>

#include "strata/core/cli.hpp"

using namespace strata;

TEST_CASE("cli::parse_integer accepts whole numbers in range, digits or scientific", "[cli]") {
  REQUIRE(cli::parse_integer<int>("--workers", "4", 1, 1024) == 4);
  REQUIRE(cli::parse_integer<int>("--workers", "+4", 1, 1024) == 4);
  REQUIRE(cli::parse_integer<std::size_t>("--synthetic", "1e6", 1, 1'000'000'000) == 1'000'000);
  REQUIRE(cli::parse_integer<std::size_t>("--synthetic", "2.5E3", 1, 10'000) == 2500);
  REQUIRE(cli::parse_integer<int>("--crash-rank", "-1", -1, 7) == -1);
  constexpr auto u64_max = std::numeric_limits<std::uint64_t>::max();
  REQUIRE(cli::parse_integer<std::uint64_t>("--seed", "18446744073709551615", 0, u64_max) ==
          u64_max);
}

TEST_CASE("cli::parse_integer refuses what would be narrowed, wrapped or rounded", "[cli]") {
  const auto refused = [](const char* text, const char* why) {
    INFO(text);
    REQUIRE_THROWS_WITH(cli::parse_integer<int>("--workers", text, 1, 1024),
                        Catch::Contains(std::string("--workers: '") + text + "' " + why) &&
                            Catch::Contains("accepted: integers 1 .. 1024"));
  };
  refused("1e10", "is out of range");
  refused("4294967297", "is out of range");
  refused("99999999999999999999999", "is out of range");
  refused("0", "is out of range");
  refused("-3", "is out of range");
  refused("1.5", "is not an integer");
  refused("1e-3", "is not an integer");
  refused("0x10", "is not an integer");
  refused("12abc", "is not an integer");
  refused(" 5", "is not an integer");
  refused("5 ", "is not an integer");
  refused("nan", "is not an integer");
  refused("inf", "is not an integer");
  refused("", "is empty");
  REQUIRE_THROWS_WITH(cli::parse_integer<std::size_t>("--batch", "9223372036854775808", 1, 1 << 24),
                      Catch::Contains("--batch: '9223372036854775808' is out of range"));
  REQUIRE_THROWS_WITH(cli::parse_integer<std::size_t>("--batch", "-1", 1, 1 << 24),
                      Catch::Contains("is negative"));
  REQUIRE_THROWS_WITH(cli::parse_integer<std::uint64_t>("--seed", "1e17", 0,
                                                        std::numeric_limits<std::uint64_t>::max()),
                      Catch::Contains("too large for scientific notation"));
  try {
    cli::parse_integer<int>("--workers", "1e10", 1, 1024);
    FAIL("no error");
  } catch (const error& e) {
    REQUIRE(e.code() == errc::invalid_argument);
  }
}

TEST_CASE("cli::parse_real accepts finite values in range and refuses the rest", "[cli]") {
  const cli::real_range positive{0.0, 1e6, true};
  REQUIRE(cli::parse_real("--link-gbps", "10", positive) == 10.0);
  REQUIRE(cli::parse_real("--link-gbps", "2.5e-1", positive) == 0.25);
  REQUIRE(cli::parse_real("--link-latency-us", "0", {0.0, 1e7}) == 0.0);
  const auto refused = [&](const char* text, const char* why) {
    INFO(text);
    REQUIRE_THROWS_WITH(cli::parse_real("--link-gbps", text, positive),
                        Catch::Contains(std::string("--link-gbps: '") + text + "' " + why) &&
                            Catch::Contains("accepted: (0, 1e+06]"));
  };
  refused("0", "is out of range");
  refused("-1", "is out of range");
  refused("nan", "is not finite");
  refused("inf", "is not finite");
  refused("1e400", "is not finite");
  refused("2e6", "is out of range");
  refused("0x1p3", "is not a decimal number");
  refused("10Gb", "is not a number");
  refused("", "is empty");
  REQUIRE_THROWS_WITH(cli::parse_real("--link-latency-us", "-1000", {0.0, 1e7}),
                      Catch::Contains("accepted: [0, 1e+07]"));
}

TEST_CASE("cli::parse_name lists the accepted names", "[cli]") {
  REQUIRE(cli::parse_name("--model", "dlrm", {"dlrm", "wide_deep"}) == "dlrm");
  REQUIRE_THROWS_WITH(
      cli::parse_name("--model", "dlrn", {"dlrm", "wide_deep"}),
      Catch::Contains("--model: 'dlrn' is not accepted; accepted: dlrm, wide_deep"));
}

TEST_CASE("cli::flag_value takes the next argument or names the flag that lacks one", "[cli]") {
  const char* argv[] = {"prog", "--seed", "7", "--out"};
  int i = 1;
  REQUIRE(cli::flag_value(4, argv, i) == "7");
  REQUIRE(i == 2);  // advanced to the value
  i = 3;            // the last argument: no value follows
  REQUIRE_THROWS_WITH(cli::flag_value(4, argv, i),
                      Catch::EndsWith(": flag --out needs a value; see --help"));
  REQUIRE(i == 3);  // not advanced past the end
  REQUIRE_THROWS_WITH(cli::flag_value(4, argv, i, "prog: "),
                      Catch::EndsWith(": prog: flag --out needs a value; see --help"));
}

TEST_CASE("launched_by_mpi reads the launchers' environment", "[core][cli]") {
  const char* names[] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK"};
  // Under mpiexec (the MPI tests) one of them is set already: keep what was there.
  std::vector<std::pair<std::string, std::string>> saved;
  for (const char* name : names)
    if (const char* v = std::getenv(name)) saved.emplace_back(name, v);
  for (const char* name : names)
    unsetenv(name);
  CHECK_FALSE(strata::cli::launched_by_mpi());
  for (const char* name : names) {
    setenv(name, "2", 1);
    CHECK(strata::cli::launched_by_mpi());
    unsetenv(name);
  }
  for (const auto& [name, value] : saved)
    setenv(name.c_str(), value.c_str(), 1);
}
