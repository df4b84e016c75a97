/// @file harness.hpp
/// Test harness: runs a parameter-server job (servers + workers) on a thread_world.
#pragma once

#include <exception>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "strata/comm/thread_world.hpp"
#include "strata/compress/identity.hpp"
#include "strata/ps.hpp"

namespace ps_test {

using namespace strata;

/// What a job reports back.
struct job_result {
  std::vector<ps::shard_stats> stats;  ///< per server
};

/// Runs `work(client, worker_index)` on every worker of `roles` with servers of
/// `server<Opt, Cons, Codec>`; dedicated servers run on their own ranks, co-located ones on a
/// thread beside the worker sharing the endpoint. Clients are shut down after `work`.
struct no_inspect {
  template <class S>
  void operator()(const S&) const {}
};

/// `inspect(server)` is called on every server after it served (from its rank's thread).
/// With `in_process` the clients pull through `ps::server::read_rows` of the servers (all of
/// them live in this process) instead of messages.
template <class Cons, class Opt, class Codec = compress::identity, class Work,
          class Inspect = no_inspect>
job_result run_job(comm::thread_world& world, const ps::shard_map& map, Opt opt, Work&& work,
                   ps::server_options sopts = {}, ps::client_options copts = {},
                   Inspect inspect = {}, bool in_process = false) {
  using server_type = ps::server<Opt, Cons, Codec>;
  const auto& roles = map.roles();
  job_result result;
  result.stats.resize(static_cast<std::size_t>(roles.servers()));
  std::vector<std::unique_ptr<server_type>> servers;
  for (int s = 0; s < roles.servers(); ++s)
    servers.push_back(std::make_unique<server_type>(map, s, opt, sopts));
  if (in_process)
    for (auto& server : servers)
      copts.in_process_servers.emplace_back(
          [at = server.get(), timeout = 30.0](
              int worker, std::size_t table, std::uint64_t step,
              std::span<const std::uint64_t> keys,
              const std::function<void(std::size_t, const float*)>& sink) {
            at->read_rows(worker, table, step, keys, timeout, sink);
          });
  world.run([&](comm::thread_transport& t) {
    const int rank = t.rank();
    if (roles.kind() == ps::placement::dedicated) {
      if (roles.is_server(rank)) {
        const int s = roles.server_index(rank);
        server_type& server = *servers[static_cast<std::size_t>(s)];
        server.serve(t);
        result.stats[static_cast<std::size_t>(s)] = server.stats();
        inspect(server);
      } else {
        ps::client<Cons, comm::thread_transport, Codec> c(t, map, copts);
        work(c, roles.worker_index(rank));
        c.shutdown();
      }
      return;
    }
    ps::shared_endpoint<comm::thread_transport> ep(t);
    const int s = roles.server_index(rank);
    server_type& server = *servers[static_cast<std::size_t>(s)];
    std::exception_ptr server_error;
    std::thread serving([&] {
      try {
        server.serve(ep);
      } catch (...) {
        server_error = std::current_exception();
      }
    });
    std::exception_ptr worker_error;
    try {
      ps::client<Cons, ps::shared_endpoint<comm::thread_transport>, Codec> c(ep, map, copts);
      work(c, roles.worker_index(rank));
      c.shutdown();
    } catch (...) {
      worker_error = std::current_exception();
    }
    serving.join();
    if (worker_error) std::rethrow_exception(worker_error);
    if (server_error) std::rethrow_exception(server_error);
    result.stats[static_cast<std::size_t>(s)] = server.stats();
    inspect(server);
  });
  return result;
}

}  // namespace ps_test
