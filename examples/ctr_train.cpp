// ctr_train: train a CTR model (DLRM or Wide & Deep) on Criteo-format data with the
// distribution strategy, consistency and gradient compression chosen by flags. Each flag
// combination is a different compile-time composition of strata::train::trainer; this program
// instantiates the combinations it offers and dispatches on the flags.
//
//   ctr_train                                   # synthetic data, 4 workers + 2 servers, hybrid,
//   int8+EF ctr_train --data train.tsv --eval-data eval.tsv --strategy ps --consistency async
//   ctr_train --synthetic 200000 --checkpoint-dir ckpt --checkpoint-every 200
//   ctr_train --synthetic 200000 --checkpoint-dir ckpt --resume
//   ctr_train --gpu 0                           # DLRM's dense part on GPU 0 (CUDA builds only)
//
// The compositions live in ctr_train.hpp and are instantiated per model in ctr_train_dlrm.cpp,
// ctr_train_wide_deep.cpp and (CUDA builds) ctr_train_gpu.cpp.
#include "ctr_train.hpp"

#include <utility>
#include <vector>

namespace ctr_train_example {

namespace {

/// Evaluation numbers of a report (-1 when the run had no evaluation).
struct eval_or_none {
  double auc = -1, logloss = -1;
  std::size_t samples = 0;
  eval_or_none() = default;
  explicit eval_or_none(const train::eval_point& e)
      : auc(e.auc), logloss(e.logloss), samples(e.samples) {}
};
[[noreturn]] void usage(int code) {
  std::printf(
      "usage: ctr_train [flags]\n"
      "  --model dlrm|wide_deep        model (dlrm: Criteo Kaggle DLRM, Adagrad for tables and "
      "MLPs;\n"
      "                                wide_deep: Adagrad for the tables, wide ones from zero, "
      "Adam\n"
      "                                for the deep MLP)\n"
      "  --strategy auto|allreduce|ps|hybrid   how embeddings and dense parameters travel\n"
      "  --consistency sync|async|bounded      PS update consistency (bounded: bounded<S>)\n"
      "  --staleness S                 bounded's S: a pull may run S steps ahead of the slowest\n"
      "                                worker's applied pushes (0..16777215, default 2)\n"
      "  --compressor none|fp16|int8|topk   dense gradients / PS pushes on the wire (int8: "
      "256-value\n"
      "                                blocks with error feedback; topk: the dense allreduce\n"
      "                                keeps the largest 1%% with error feedback, hybrid's\n"
      "                                pushes int8; not with --strategy ps)\n"
      "  --fp16-pulls                    PS pulls travel as fp16 (rows and dense parameters)\n"
      "  --workers N --servers S (0 = co-located) --server-threads T\n"
      "  --batch B (global: split evenly over the workers)\n"
      "  --lr LR (tables; dlrm 0.02, wide_deep 0.05) --dense-lr LR (MLPs; dlrm 0.01, wide_deep\n"
      "                                0.001)\n"
      "  --epochs E --max-steps N\n"
      "  --seed S\n"
      "  --data FILE.tsv [--eval-data FILE.tsv] [--skip-bad-lines] | --synthetic N (rows)\n"
      "  --stream                        read TSV data by streaming it (chunks of 4096 lines,\n"
      "                                parsed as the shuffle window reaches them; resident\n"
      "                                memory bounded) instead of loading it whole; a TSV\n"
      "                                larger than half the memory is streamed anyway\n"
      "  --data DIR|FILE.ctrb [--eval-data DIR|FILE.ctrb|FILE.tsv]   converted days\n"
      "                                (strata_convert): memory-mapped, resident memory bounded\n"
      "                                by the shuffle window; tables' rows from the files\n"
      "  --data-shards N                 converted data: shards each epoch's chunks are dealt\n"
      "                                into (default: one per worker, each reads only its own;\n"
      "                                equal N gives the same batches at any worker count\n"
      "                                dividing it)\n"
      "  --shuffle-window N              converted data: examples shuffled together per shard\n"
      "                                (default 262144)\n"
      "  --eval-samples N (held-out synthetic rows) --eval-every STEPS\n"
      "  --table-rows R (hash buckets per feature) --dim D\n"
      "  --distinct-ids K (synthetic: ids per categorical feature, Zipf-distributed)\n"
      "  --checkpoint-dir DIR --checkpoint-every STEPS --resume\n"
      "                                (a job locks DIR for its run; a fresh run refuses a DIR\n"
      "                                that holds checkpoints: continue them with --resume)\n"
      "  --resume-from CKPT              start from this checkpoint (a step-N folder: the way out\n"
      "                                of a damaged 'latest'), write new ones to --checkpoint-dir\n"
      "  --trace FILE                    a timeline of every rank (Chrome/Perfetto JSON: open at\n"
      "                                ui.perfetto.dev); under mpirun each rank writes\n"
      "                                FILE's <stem>.rank<R><ext>\n"
      "  --no-divergence-guard           keep training through a non-finite loss or gradient\n"
      "  --on-divergence stop|skip       a non-finite step stops the run (default) or its batch\n"
      "                                  is dropped (zero gradients) and counted\n"
      "                                (by default the run stops at that step, names the last\n"
      "                                good checkpoint; no checkpoint is ever written from\n"
      "                                non-finite values either way)\n"
      "  --link-gbps G --link-latency-us U  emulate a network between ranks: each rank is a host\n"
      "                                with one full-duplex interface of G Gbit/s on a switch\n"
      "                                (a server answering many workers shares it)\n"
      "  --link-per-pair                 instead a dedicated G Gbit/s link per pair of ranks\n"
      "  --advise                        predict the step time of every strategy x compressor on\n"
      "                                the cluster of --workers / --servers / --link-gbps /\n"
      "                                --link-latency-us (a few probe steps of each here, no "
      "link;\n"
      "                                docs/strategy-guide.md), print the ranking, train nothing;\n"
      "                                --strategy / --compressor given: only those compared;\n"
      "                                with --strategy auto, a --link-gbps makes auto use it\n"
      "  --pull-messages                 PS pulls as messages even in one process (by default\n"
      "                                they read the servers' rows directly when no link,\n"
      "                                straggler or fault is emulated; same results)\n"
      "  --tiny                          small MLPs (quick runs)\n"
      "  --bottom-mlp W1-W2-...          DLRM's bottom MLP hidden widths (default 512-256-64; the\n"
      "                                last layer, --dim wide, is added)\n"
      "  --top-mlp W1-W2-...             DLRM's top MLP / Wide & Deep's deep MLP hidden widths\n"
      "                                (default 512-256 / 256-128; the output layer is added)\n"
      "  --straggler W:F                 worker W computes F times slower (F >= 1; repeatable)\n"
      "  --gemm cblas|onednn|eigen       library for the MLPs' matrix products (default: cblas\n"
      "                                when built with libblas-dev, unless OpenBLAS runs a kernel\n"
      "                                older than the CPU; then onednn, else eigen. The summary\n"
      "                                says which and why; engines agree up to float rounding)\n"
      "  --gpu DEVICE                    DLRM's dense part on this CUDA device (cuda::dlrm; every\n"
      "                                worker shares it; tables stay on the CPU / servers)\n"
      "  --crash-rank R --crash-after-sends N   fault rehearsal: rank R fails on its N-th send\n"
      "                                (threads: an error stops every rank; mpirun: the process "
      "dies)\n"
      "  --crash-phase pull|push|allreduce|checkpoint   ... its N-th send of that phase\n"
      "  --report-json PATH              also write the final report as one JSON object\n"
      "  --export DIR                    after training, write an inference bundle of the final\n"
      "                                model to DIR (docs/serving.md; DIR must be new or empty)\n"
      "  --export-precision fp32|fp16|int8   the bundle's embedding rows (default fp32)\n"
      "  --no-progress\n");
  std::exit(code);
}

/// "512-256-64" → {512, 256, 64}: 1 to 16 layers of 1 to 65536 units.
std::vector<std::size_t> parse_widths(std::string_view flag, std::string_view text) {
  std::vector<std::size_t> widths;
  std::size_t start = 0;
  while (true) {
    const std::size_t dash = text.find('-', start);
    const std::string_view item =
        text.substr(start, dash == std::string_view::npos ? std::string_view::npos : dash - start);
    widths.push_back(cli::parse_integer<std::size_t>(flag, item, 1, 65536));
    if (dash == std::string_view::npos) break;
    start = dash + 1;
  }
  if (widths.size() > 16)
    fail(errc::invalid_argument, cat(flag, " '", text, "' has ", widths.size(),
                                     " layers; give 1 to 16 widths such as 512-256"));
  return widths;
}

/// "W:F" → {worker W, slowdown F}: F in [1, 1000].
std::pair<int, double> parse_straggler(std::string_view flag, std::string_view text) {
  const std::size_t colon = text.find(':');
  if (colon == std::string_view::npos)
    fail(errc::invalid_argument, cat(flag, " '", text,
                                     "' must be WORKER:FACTOR, e.g. 1:5 (worker 1 computes 5x "
                                     "slower)"));
  return {cli::parse_integer<int>(flag, text.substr(0, colon), 0, 1023),
          cli::parse_real(flag, text.substr(colon + 1), {1.0, 1000.0})};
}

/// Creates `dir` if needed and proves it writable, before any data is read or any step runs
/// (a checkpoint target found unusable after training would lose the whole run).
void check_checkpoint_dir(const std::filesystem::path& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (fs::exists(dir, ec) && !fs::is_directory(dir, ec))
    fail(errc::invalid_argument, cat("--checkpoint-dir ", dir.string(),
                                     " exists and is not a directory; name a directory"));
  fs::create_directories(dir, ec);
  if (ec)
    fail(errc::io_error, cat("--checkpoint-dir ", dir.string(), ": cannot create it (",
                             ec.message(), "); name a directory you can write"));
  const fs::path probe = dir / cat(".write-test-", ::getpid());
  {
    std::ofstream out(probe);
    out << "strata";
    if (!out.good())
      fail(errc::io_error, cat("--checkpoint-dir ", dir.string(),
                               ": cannot write into it; name a directory you can write"));
  }
  fs::remove(probe, ec);
}

/// The embedding tables' memory in each process that holds rows, at most (the start-up report
/// and check): under ps / hybrid (and auto) the rows of every table spread over the servers
/// (dedicated under mpirun: one server per process; co-located: one shard per rank; threads:
/// every server in this process), each server's rows in its lock stripes' row stores
/// (ps::shard_table_bytes: row_store::max_bytes per stripe); under allreduce every worker holds
/// a whole replica (embedding::local: 4 · (dim + state) bytes a row). Every table has
/// --table-rows rows; Adagrad keeps `dim` state floats a row.
struct table_memory {
  std::string holder = "server process";  ///< what holds the rows
  int servers = 1;                        ///< servers the rows spread over (sharded)
  int per_process = 1;                    ///< servers (or replicas) in one process
  std::size_t tables = 0;
  std::string first, last;            ///< names of the first and last table (C1, C26)
  std::string widest;                 ///< the first table of the most bytes a row
  std::uint64_t rows_per_server = 0;  ///< rows of one table on one server
  std::uint64_t rows = 0;             ///< rows of every table in one process
  double store_bytes_per_row = 0;     ///< row_store::bytes_per_row of the widest table
  std::size_t payload = 0;            ///< its weights and state (bytes)
  double bytes = 0;  ///< one process's tables, at most (a double: no overflow at 2^40 rows)
};

/// `processes`: one server (or replica) per process, as under mpirun.
table_memory embedding_memory(const flags& f, int servers, bool processes) {
  struct shape {
    std::string name;
    std::size_t dim;
    std::uint64_t rows;
  };
  std::vector<shape> tables;  // as the models name them: C1..C26, or wide_0..25 + deep_0..25
  if (f.model == "wide_deep") {
    for (std::size_t c = 0; c < 26; ++c)
      tables.push_back({cat("wide_", c), 1, f.rows_of(c)});
    for (std::size_t c = 0; c < 26; ++c)
      tables.push_back({cat("deep_", c), f.dim, f.rows_of(c)});
  } else {
    for (std::size_t c = 1; c <= 26; ++c)
      tables.push_back({cat("C", c), f.dim, f.rows_of(c - 1)});
  }
  table_memory m;
  m.tables = tables.size();
  m.first = tables.front().name;
  m.last = tables.back().name;
  const bool sharded = f.strategy != "allreduce";
  m.servers = sharded ? std::max(servers, 1) : 1;
  m.per_process = processes ? 1 : sharded ? m.servers : f.options.workers;
  if (!sharded) m.holder = processes ? "worker process" : "process";
  if (sharded && !processes) m.holder = "process";
  for (const auto& t : tables) {
    const std::size_t state = optim::adagrad::state_floats(t.dim);
    const std::uint64_t per_server =
        (t.rows + m.servers - 1) / static_cast<std::uint64_t>(m.servers);
    m.rows_per_server = std::max(m.rows_per_server, per_server);
    const std::uint64_t one = sharded ? ps::shard_table_bytes(per_server, t.dim, state)
                                      : t.rows * (t.dim + state) * sizeof(float);
    m.bytes += static_cast<double>(one) * m.per_process;
    m.rows += per_server * static_cast<std::uint64_t>(m.per_process);
    const double per_row = sharded ? row_store::bytes_per_row(t.dim, state)
                                   : static_cast<double>((t.dim + state) * sizeof(float));
    if (per_row > m.store_bytes_per_row) {
      m.store_bytes_per_row = per_row;
      m.payload = (t.dim + state) * sizeof(float);
      m.widest = t.name;
    }
  }
  return m;
}

/// `v` with one decimal ("539.4").
std::string one_decimal(double v) {
  char text[32];
  std::snprintf(text, sizeof text, "%.1f", v);
  return text;
}

/// "26 tables (C1 .. C26) of 100000 rows over 2 server(s)".
std::string describe_tables(const table_memory& m, const flags& f) {
  const auto [low, high] = std::minmax_element(f.feature_rows.begin(), f.feature_rows.end());
  return cat(m.tables, " tables (", m.first, " .. ", m.last, ") of ",
             f.feature_rows.empty() ? cat(f.table_rows) : cat(*low, " .. ", *high), " rows",
             f.vocabulary.empty() ? "" : " (frequency-threshold vocabulary)",
             m.per_process > 1 && m.holder == "process" && f.strategy == "allreduce"
                 ? cat(", a replica for each of ", m.per_process, " workers")
                 : "",
             f.strategy != "allreduce" ? cat(" over ", m.servers, " server(s)") : "");
}

/// The start-up line (leader): embedding rows per server and bytes per row, per server process,
/// and what this process may allocate.
void report_table_memory(const flags& f, int servers) {
  const table_memory m = embedding_memory(f, servers, f.process != nullptr);
  const memory_headroom room = current_memory_headroom();
  const bool sharded = f.strategy != "allreduce";
  log_line(cat("embedding: ", describe_tables(m, f), ": ", m.rows_per_server,
               " rows of each table per ", sharded ? "server" : "replica", ", ", m.rows,
               " rows per ", m.holder, ", ", one_decimal(m.store_bytes_per_row),
               " bytes per row at most (", m.payload, " B weights + Adagrad state",
               sharded ? cat(", the rest key and index; every row ",
                             one_decimal(m.rows > 0 ? m.bytes / static_cast<double>(m.rows) : 0.0),
                             " on average with the lock stripes' chunks")
                       : "",
               ") = ", one_decimal(m.bytes / (1 << 20)), " MiB per ", m.holder,
               " at most; this process may allocate ", room.describe()));
}

/// Refuses, before anything is allocated, embedding tables that cannot fit the memory this
/// process may allocate (current_memory_headroom: physical memory, RLIMIT_AS less VmSize,
/// RLIMIT_DATA less VmData): errc::out_of_memory naming the tables, the rows per server, the
/// bytes per row and the least --servers that would fit. Every rank checks (the same sizes, its
/// own limit), so a refused job ends on every rank at once.
void check_table_memory(const flags& f, int table_holders) {
  const table_memory m = embedding_memory(f, table_holders, f.process != nullptr);
  const memory_headroom room = current_memory_headroom();
  if (m.bytes <= static_cast<double>(room.bytes)) return;
  // The rehearsal of what this check prevents (tests/mpi/ctr_train_tables_beyond_one_process):
  // a job that runs out of memory while training.
  if (const char* skip = std::getenv("STRATA_SKIP_TABLE_MEMORY_CHECK"); skip && *skip == '1')
    return;
  const bool sharded = f.strategy != "allreduce";
  int fits = 0;  // the least number of server processes whose share fits this headroom
  for (int s = f.process != nullptr ? std::max(table_holders, 1) + 1 : 1; sharded && s <= 65536;
       ++s)
    if (embedding_memory(f, s, true).bytes <= static_cast<double>(room.bytes)) {
      fits = s;
      break;
    }
  std::string what_to_do;
  if (!sharded)
    what_to_do =
        "lower --table-rows or --dim, or keep the tables on parameter servers (--strategy ps or "
        "hybrid under mpiexec with --servers S: each server process holds 1/S of the rows)";
  else if (fits == 0)
    what_to_do = "lower --table-rows or --dim (even 65536 server processes would not hold them)";
  else
    what_to_do = cat("run ", f.process != nullptr ? "" : "under mpiexec with ", "--servers ", fits,
                     " or more (mpiexec -n <workers + ", fits,
                     ">: each server process holds 1/S of the rows), or lower --table-rows or "
                     "--dim");
  fail(errc::out_of_memory,
       cat("the embedding tables do not fit one ", m.holder, ": table ", m.widest, " (and each of ",
           describe_tables(m, f), ") needs ", m.rows_per_server, " rows per ",
           sharded ? "server" : "replica",
           m.per_process > 1
               ? cat(", ", m.per_process, sharded ? " servers" : " replicas", " in this process")
               : "",
           ", up to ", one_decimal(m.store_bytes_per_row), " bytes per row (", m.payload,
           " B weights + Adagrad state", sharded ? ", the rest key and index" : "", "): ", m.rows,
           " rows = ", one_decimal(m.bytes / (1 << 20)), " MiB per ", m.holder,
           ", but this process may allocate ", room.describe(), "; ", what_to_do));
}

flags parse(int argc, char** argv) {
  flags f;
  f.options.epochs = 1;
  f.options.workers = 4;
  f.options.servers = 2;
  f.options.eval_every = 0;
  double link_gbps = 0, link_latency_us = 0;
  bool link_per_pair = false;
  constexpr std::uint64_t u64_max = std::numeric_limits<std::uint64_t>::max();
  constexpr std::uint64_t many = std::uint64_t{1} << 40;  // counts no run here reaches
  for (int i = 1; i < argc; ++i) {
    const std::string_view a = argv[i];
    const auto value = [&] { return cli::flag_value(argc, argv, i); };
    // Every number is checked whole and in range (strata::cli): nothing is narrowed or wrapped.
    const auto integer = [&]<class T>(T lo, T hi) {
      return cli::parse_integer<T>(a, value(), lo, hi);
    };
    const auto real = [&](cli::real_range range) { return cli::parse_real(a, value(), range); };
    const cli::real_range learning_rate{0.0, 1e3, true};
    if (a == "--help" || a == "-h")
      usage(0);
    else if (a == "--model")
      f.model = cli::parse_name(a, value(), {"dlrm", "wide_deep"});
    else if (a == "--strategy") {
      f.strategy = cli::parse_name(a, value(), {"auto", "allreduce", "ps", "hybrid"});
      f.strategy_given = f.strategy != "auto";
    } else if (a == "--consistency")
      f.consistency = cli::parse_name(a, value(), {"sync", "async", "bounded"});
    else if (a == "--staleness") {
      f.staleness = integer(std::uint64_t{0}, ps::staleness_limit - 1);
      f.staleness_given = true;
    } else if (a == "--compressor") {
      f.compressor = cli::parse_name(a, value(), {"none", "fp16", "int8", "topk"});
      f.compressor_given = true;
    } else if (a == "--fp16-pulls")
      f.options.fp16_pulls = true;
    else if (a == "--bottom-mlp")
      f.bottom_mlp = parse_widths(a, value());
    else if (a == "--top-mlp")
      f.top_mlp = parse_widths(a, value());
    else if (a == "--straggler")
      f.stragglers.push_back(parse_straggler(a, value()));
    else if (a == "--workers")
      f.options.workers = integer(1, 1024);
    else if (a == "--servers")
      f.options.servers = integer(0, 1024);
    else if (a == "--server-threads")
      f.options.server_threads = integer(1, 1024);
    else if (a == "--batch")
      f.global_batch = integer(std::size_t{1}, std::size_t{1} << 24);
    else if (a == "--lr")
      f.lr = static_cast<float>(real(learning_rate));
    else if (a == "--dense-lr")
      f.dense_lr = static_cast<float>(real(learning_rate));
    else if (a == "--epochs")
      f.options.epochs = integer(std::size_t{1}, std::size_t{1'000'000});
    else if (a == "--max-steps")
      f.options.max_steps = integer(std::size_t{0}, std::size_t{many});
    else if (a == "--seed")
      f.options.seed = integer(std::uint64_t{0}, u64_max);
    else if (a == "--data")
      f.data = value();
    else if (a == "--eval-data")
      f.eval_data = value();
    else if (a == "--skip-bad-lines")
      f.skip_bad_lines = true;
    else if (a == "--stream")
      f.stream = true;
    else if (a == "--synthetic") {
      f.synthetic = integer(std::size_t{1}, std::size_t{1'000'000'000});
      f.synthetic_given = true;
    } else if (a == "--eval-samples")
      f.eval_samples = integer(std::size_t{0}, std::size_t{1'000'000'000});
    else if (a == "--eval-every")
      f.options.eval_every = integer(std::size_t{0}, std::size_t{many});
    else if (a == "--table-rows") {
      f.table_rows = integer(std::uint64_t{1}, many);
      f.table_rows_given = true;
    } else if (a == "--data-shards")
      f.options.data_shards = integer(std::size_t{1}, std::size_t{1} << 20);
    else if (a == "--shuffle-window")
      f.options.shuffle_window = integer(std::size_t{1}, std::size_t{1} << 32);
    else if (a == "--distinct-ids")
      f.distinct_ids = integer(std::uint64_t{1}, many);
    else if (a == "--dim")
      f.dim = integer(std::size_t{1}, std::size_t{4096});
    else if (a == "--checkpoint-dir")
      f.options.checkpoint_dir = value();
    else if (a == "--checkpoint-every")
      f.options.checkpoint_every = integer(std::size_t{0}, std::size_t{many});
    else if (a == "--resume")
      f.options.resume = true;
    else if (a == "--resume-from")
      f.options.resume_from = value();
    else if (a == "--trace")
      f.options.trace_file = value();
    else if (a == "--link-gbps") {  // 1 Mbit/s .. 10 Tbit/s
      link_gbps = real({1e-3, 1e4});
      f.link_given = true;
    } else if (a == "--advise")
      f.advise = true;
    else if (a == "--link-latency-us")  // up to 10 s
      link_latency_us = real({0.0, 1e7});
    else if (a == "--link-per-pair")
      link_per_pair = true;
    else if (a == "--pull-messages")
      f.options.in_process_pulls = false;
    else if (a == "--no-divergence-guard")
      f.options.divergence_guard = false;
    else if (a == "--on-divergence")
      f.options.on_divergence = cli::parse_name(a, value(), {"stop", "skip"}) == "skip"
                                    ? train::divergence_policy::skip_batch
                                    : train::divergence_policy::stop;
    else if (a == "--tiny")
      f.tiny = true;
    else if (a == "--gemm") {
      const auto name = cli::parse_name(a, value(), {"cblas", "onednn", "eigen"});
      f.gemm = *nn::parse_gemm_engine(name);
      nn::expect_gemm_available(f.gemm, "--gemm");
      f.gemm_given = true;
    } else if (a == "--gpu")
      f.gpu = integer(0, 63);
    else if (a == "--report-json")
      f.report_json = value();
    else if (a == "--export")
      f.export_dir = value();
    else if (a == "--export-precision")
      f.export_precision = cli::parse_name(a, value(), {"fp32", "fp16", "int8"});
    else if (a == "--no-progress")
      f.options.progress = false;
    else if (a == "--crash-rank")
      f.crash_rank = integer(0, 1 << 20);
    else if (a == "--crash-after-sends")
      f.crash_after = integer(std::uint64_t{1}, u64_max);
    else if (a == "--crash-phase")
      f.crash_phase = comm::parse_phase(
          cli::parse_name(a, value(), {"any", "pull", "push", "allreduce", "checkpoint"}));
    else
      fail(errc::invalid_argument, cat("unknown flag '", a, "'; see --help"));
  }
  f.options.link.bandwidth_bytes_per_second = link_gbps * 1e9 / 8;
  f.options.link.latency_seconds = link_latency_us * 1e-6;
  f.options.link.per_rank_nic = !link_per_pair;
  if (f.crash_phase == comm::phase::any) {
    f.options.fail_rank = f.crash_rank;
    f.options.fail_on_send = f.crash_after;
  } else if (f.crash_rank >= 0) {  // threads: a fault plan that kills the rank there
    f.options.faults = {{.rank = f.crash_rank,
                         .kind = comm::fault_kind::kill,
                         .when = f.crash_phase,
                         .nth = f.crash_after}};
  }
  STRATA_EXPECTS(f.gpu < 0 || f.model == "dlrm",
                 "--gpu: only --model dlrm has a GPU model (cuda::dlrm); drop --gpu for ", f.model);
  STRATA_EXPECTS((f.crash_rank < 0) == (f.crash_after == 0),
                 "--crash-rank R and --crash-after-sends N go together (fault rehearsal: rank R "
                 "fails on its N-th send); pass both or neither");
  STRATA_EXPECTS(f.bottom_mlp.empty() || f.model == "dlrm",
                 "--bottom-mlp: Wide & Deep has no bottom MLP (--top-mlp sets its deep MLP)");
  STRATA_EXPECTS(f.compressor != "topk" || f.strategy != "ps",
                 "--compressor topk sparsifies the dense allreduce, which --strategy ps does not "
                 "run (its dense gradients are pushes); use allreduce or hybrid, or int8 / fp16 "
                 "with ps");
  STRATA_EXPECTS(f.crash_phase == comm::phase::any || f.crash_rank >= 0,
                 "--crash-phase needs --crash-rank R and --crash-after-sends N (rank R fails on "
                 "its N-th send of that phase)");
  STRATA_EXPECTS(f.strategy != "allreduce" || f.consistency == "sync",
                 "--strategy allreduce is always synchronous; use --consistency sync");
  STRATA_EXPECTS(!f.staleness_given || f.consistency == "bounded",
                 "--staleness bounds --consistency bounded; with --consistency ", f.consistency,
                 " drop it (or pass --consistency bounded)");
  STRATA_EXPECTS(!f.advise || f.link_given,
                 "--advise needs the cluster's network: --link-gbps G "
                 "(and --link-latency-us U)");
  STRATA_EXPECTS(!f.advise || f.gpu < 0, "--advise: the probes train the CPU model; drop --gpu");
  STRATA_EXPECTS(!f.advise || f.consistency == "sync" || f.options.servers >= 1,
                 "--advise: with --consistency ", f.consistency,
                 " and --servers 0 there is nothing to compare (allreduce is sync only; the "
                 "advisor models dedicated servers: pass --servers S)");
  STRATA_EXPECTS(f.data.empty() || !f.synthetic_given,
                 "--data and --synthetic both given: train on one of them");
  STRATA_EXPECTS(f.eval_data.empty() || !f.data.empty(),
                 "--eval-data needs --data (synthetic runs generate their own eval rows)");
  STRATA_EXPECTS(!f.options.resume || !f.options.checkpoint_dir.empty(),
                 "--resume needs --checkpoint-dir DIR (the directory to resume from)");
  STRATA_EXPECTS(!f.options.resume || f.options.resume_from.empty(),
                 "--resume and --resume-from both given: --resume-from names the checkpoint, "
                 "drop --resume");
  if (!f.options.resume_from.empty() &&
      !std::filesystem::exists(f.options.resume_from / "state.ckpt") &&
      !std::filesystem::exists(f.options.resume_from / "latest"))
    fail(errc::invalid_argument,
         cat("--resume-from ", f.options.resume_from.string(),
             " is not a checkpoint (no state.ckpt) nor a checkpoint directory (no latest)"));
  if (!f.options.checkpoint_dir.empty()) check_checkpoint_dir(f.options.checkpoint_dir);
  if (!f.options.trace_file.empty()) {  // before any data: a trace lost at the end costs a run
    const auto dir = f.options.trace_file.parent_path();
    if (!dir.empty() && !std::filesystem::is_directory(dir))
      fail(errc::io_error, cat("--trace ", f.options.trace_file.string(), ": the directory ",
                               dir.string(), " does not exist; create it or name another file"));
  }
  STRATA_EXPECTS(f.gpu < 0 || f.export_dir.empty(),
                 "--export with --gpu: write a checkpoint (--checkpoint-dir) and export it with "
                 "strata_export");
  STRATA_EXPECTS(f.export_precision.empty() || !f.export_dir.empty(),
                 "--export-precision needs --export DIR (the bundle to write)");
  if (!f.export_dir.empty() && std::filesystem::exists(f.export_dir) &&
      !(std::filesystem::is_directory(f.export_dir) && std::filesystem::is_empty(f.export_dir)))
    fail(errc::invalid_argument,
         cat("--export ", f.export_dir.string(),
             " exists and is not an empty directory; name a new directory for the bundle"));
  return f;
}

/// Steps in one epoch of `data` for this run (as the trainer walks it).
std::size_t steps_per_epoch(const flags& f, const data::example_source& data) {
  return data.steps_per_epoch({.world_size = static_cast<std::size_t>(f.options.workers),
                               .rank = 0,
                               .global_batch = f.global_batch,
                               .seed = f.options.seed,
                               .data_shards = f.options.data_shards,
                               .shuffle_window = f.options.shuffle_window});
}

/// Converted data: a folder or a .ctrb file (TSV otherwise).
bool is_converted(const std::string& path) {
  return !path.empty() && (std::filesystem::is_directory(path) ||
                           std::filesystem::path(path).extension() == data::ctr_binary_extension);
}

/// Converted --data fixes the hashing: the tables' rows come from the files (a different
/// --table-rows is refused: the keys were hashed into the files' rows), and its seed hashes
/// --eval-data TSV and an exported bundle's raw inputs.
void adopt_file_hashing(flags& f) {
  if (!is_converted(f.data)) return;
  const data::ctr_files files(f.data);
  const auto& rows = files.table_rows();
  const auto [low, high] = std::minmax_element(rows.begin(), rows.end());
  const bool vocabulary = files.vocabulary() != nullptr;
  STRATA_EXPECTS(!f.table_rows_given || (f.table_rows == *high && !vocabulary), "--table-rows ",
                 f.table_rows, ": the converted data in ", f.data,
                 vocabulary
                     ? cat(" is read through its vocabulary (", files.vocabulary_file().string(),
                           ") into tables of ", *low, " .. ", *high, " rows")
                     : cat(" was hashed into tables of ", *high, " rows"),
                 "; drop --table-rows (it is taken from the files) or convert again");
  f.table_rows = *high;
  if (*low != *high) f.feature_rows = rows;
  if (vocabulary) f.vocabulary = files.vocabulary_file();
  f.hash_seed = files.schema().hash_seed;
}

/// Checkpoints of a run that reads its data through a vocabulary keep a copy of it in the
/// checkpoint directory (`vocabulary.ctrv`): strata_export finds it there, and a resume through
/// another vocabulary (or none) is refused — its rows would mean other ids.
void keep_vocabulary_with_checkpoints(const flags& f) {
  const auto& dir = f.options.checkpoint_dir;
  if (dir.empty()) return;
  const auto kept = dir / std::string(data::ctr_vocabulary_name);
  std::error_code ec;
  const bool exists = std::filesystem::exists(kept, ec);
  if (f.options.resume) {
    const auto fingerprint = [](const std::filesystem::path& p) {
      return data::ctr_vocabulary::load(p).fingerprint();
    };
    STRATA_EXPECTS(exists == !f.vocabulary.empty() &&
                       (!exists || fingerprint(kept) == fingerprint(f.vocabulary)),
                   "--resume: the checkpoints in ", dir.string(),
                   exists ? " were trained through the vocabulary kept beside them"
                          : " were trained without a vocabulary",
                   f.vocabulary.empty()
                       ? cat(" but --data ", f.data, " is read without one")
                       : cat(" but --data ", f.data, " is read through ", f.vocabulary.string()),
                   ": their rows would mean other ids; resume with the data they were trained on");
    return;
  }
  // A fresh run into a directory holding checkpoints is refused by the trainer: leave it be.
  if (!f.leader() || !train::checkpoint_directory(dir).steps().empty()) return;
  if (f.vocabulary.empty()) {
    if (exists) std::filesystem::remove(kept);  // a fresh run without one
    return;
  }
  std::filesystem::create_directories(dir);
  auto temp = kept;
  temp += ".partial";
  std::filesystem::copy_file(f.vocabulary, temp, std::filesystem::copy_options::overwrite_existing);
  std::filesystem::rename(temp, kept);
}

datasets load_data(const flags& f) {
  datasets d;
  data::criteo_options reader;
  reader.table_rows = {f.table_rows};
  reader.skip_bad_lines = f.skip_bad_lines;
  reader.hash_seed = f.hash_seed.value_or(f.options.seed);
  const auto load = [&](const std::string& path,
                        const char* what) -> std::unique_ptr<const data::example_source> {
    if (is_converted(path)) {
      auto files = std::make_unique<const data::ctr_files>(path);
      if (f.leader()) log_line(cat(what, " data: ", files->describe()));
      return files;
    }
    // A TSV is loaded whole (about 1.05 bytes of memory per byte of file: 270 B an example
    // from ~257 B a line) unless --stream, or it would take more than half the memory.
    std::error_code missing;  // a missing file is reported by the reader, with its remedy
    const auto size = std::filesystem::file_size(path, missing);
    const double needed = missing ? 0.0 : 1.05 * static_cast<double>(size);
    const double memory = static_cast<double>(::sysconf(_SC_PHYS_PAGES)) *
                          static_cast<double>(::sysconf(_SC_PAGESIZE));
    if (f.stream || (memory > 0 && needed > 0.5 * memory)) {
      auto files = std::make_unique<const data::ctr_files>(data::tsv_input{{path}, reader});
      if (f.leader())
        log_line(cat(what, " data: ", files->describe(),
                     f.stream ? std::string()
                              : cat(" (streamed: loaded whole it would take ",
                                    one_decimal(needed / (1 << 30)), " GiB of ",
                                    one_decimal(memory / (1 << 30)),
                                    "; strata_convert it once to skip the parse at start-up)")));
      return files;
    }
    data::criteo_summary summary;
    auto set = std::make_unique<const data::ctr_dataset>(data::load_criteo(path, reader, &summary));
    if (f.leader()) log_line(cat(what, " data: ", summary.to_string()));
    return set;
  };
  if (!f.data.empty()) {
    d.train = load(f.data, "train");
    if (!f.eval_data.empty()) {
      d.eval = load(f.eval_data, "eval");
      const auto* train = dynamic_cast<const data::ctr_files*>(d.train.get());
      const auto vocabulary_of = [](const data::ctr_files* files) {
        return files != nullptr && files->vocabulary() != nullptr
                   ? files->vocabulary()->fingerprint()
                   : std::uint64_t{0};
      };
      if (const auto* eval = dynamic_cast<const data::ctr_files*>(d.eval.get());
          eval != nullptr && !eval->streamed_tsv()) {
        const auto expected = f.feature_rows.empty() ? std::vector<std::uint64_t>(
                                                           eval->table_rows().size(), f.table_rows)
                                                     : f.feature_rows;
        STRATA_EXPECTS(
            eval->table_rows() == expected && eval->schema().hash_seed == reader.hash_seed &&
                vocabulary_of(eval) == vocabulary_of(train),
            "--eval-data ", f.eval_data, " was converted with other hashing (tables of ",
            eval->table_rows().front(), " rows, seed ", eval->schema().hash_seed,
            eval->vocabulary() != nullptr ? cat(", vocabulary ", eval->vocabulary_file().string())
                                          : std::string(", no vocabulary"),
            ") than the training data (", expected.front(), " rows, seed ", reader.hash_seed,
            f.vocabulary.empty() ? std::string(", no vocabulary")
                                 : cat(", vocabulary ", f.vocabulary.string()),
            "); convert both with the same --table-rows and --seed",
            f.vocabulary.empty() ? std::string()
                                 : cat(", the eval days into the training data's folder"));
      } else if (!f.vocabulary.empty()) {
        fail(errc::invalid_argument,
             cat("--eval-data ", f.eval_data, ": the training data is read through the vocabulary ",
                 f.vocabulary.string(),
                 " (frequency thresholding) but a TSV file is not; convert "
                 "the eval day into the training data's folder (strata_convert --out DIR ",
                 f.eval_data, ") and pass its .ctrb file"));
      }
    }
    return d;
  }
  // Synthetic Criteo-format files with a hidden teacher: written as real TSV and read back
  // through the same reader a Criteo file goes through.
  const auto dir = std::filesystem::temp_directory_path() / "strata-ctr-train";
  std::filesystem::create_directories(dir);
  data::synthetic_criteo gen;
  gen.rows = f.synthetic + f.eval_samples;
  gen.seed = f.options.seed;
  gen.distinct_ids = {f.distinct_ids};
  // One file per process: under mpirun every process generates the same rows itself.
  const auto path = dir / cat("synthetic-", gen.rows, "-", gen.seed, "-", ::getpid(), ".tsv");
  const auto report = data::write_synthetic_criteo(path, gen);
  d.teacher_auc = report.teacher_auc;
  if (f.leader())
    log_line(cat("synthetic data: ", report.rows, " rows, CTR ", report.positive_rate,
                 ", teacher AUC ", report.teacher_auc, " (", path.string(), ")"));
  auto all = data::load_criteo(path, reader);
  std::filesystem::remove(path);
  // The last eval_samples rows are held out.
  std::vector<std::size_t> train_idx(f.synthetic), eval_idx(all.size() - f.synthetic);
  std::iota(train_idx.begin(), train_idx.end(), std::size_t{0});
  std::iota(eval_idx.begin(), eval_idx.end(), f.synthetic);
  auto train = std::make_unique<data::ctr_dataset>(), eval = std::make_unique<data::ctr_dataset>();
  train->append(all.gather(train_idx));
  eval->append(all.gather(eval_idx));
  d.train = std::move(train);
  d.eval = std::move(eval);
  return d;
}

/// The final report as one JSON object (what bench_ctr reads).
/// `embedding_floats` / `dense_floats`: the model's parameters (tables at their full rows).
void write_report_json(const std::string& path, const train::train_report& r, double teacher_auc,
                       std::uint64_t embedding_floats, std::uint64_t dense_floats) {
  std::ofstream out(path);
  if (!out) fail(errc::io_error, cat("--report-json: cannot write '", path, "'"));
  const eval_or_none e = r.evals.empty() ? eval_or_none{} : eval_or_none{r.evals.back()};
  char checksums[64];
  std::snprintf(checksums, sizeof checksums, "%016llx/%016llx",
                static_cast<unsigned long long>(r.dense_checksum),
                static_cast<unsigned long long>(r.embedding_checksum));
  out << "{\"strategy\": \"" << r.strategy << "\", \"workers\": " << r.workers
      << ", \"servers\": " << r.servers << ", \"steps\": " << r.steps
      << ", \"samples\": " << r.samples << ", \"seconds\": " << r.seconds
      << ", \"samples_per_s\": " << r.samples_per_second << ", \"train_auc\": " << r.train_auc
      << ", \"train_logloss\": " << r.train_loss << ", \"eval_auc\": " << e.auc
      << ", \"eval_logloss\": " << e.logloss << ", \"eval_samples\": " << e.samples
      << ", \"teacher_auc\": " << teacher_auc << ", \"checksum\": \"" << checksums << "\"";
  for (std::size_t p = 0; p < train::phase_count; ++p)
    out << ", \"seconds_" << train::phase_names[p] << "\": " << r.phase_seconds[p];
  out << ", \"embedding_floats\": " << embedding_floats << ", \"dense_floats\": " << dense_floats
      << ", \"bytes_worker_to_worker\": " << r.bytes_worker_to_worker
      << ", \"bytes_worker_to_server\": " << r.bytes_worker_to_server
      << ", \"bytes_server_to_worker\": " << r.bytes_server_to_worker << ", \"servers_stats\": [";
  for (std::size_t s = 0; s < r.server_stats.size(); ++s) {
    const auto& st = r.server_stats[s];
    out << (s ? ", " : "") << "{\"bytes_received\": " << st.bytes_received
        << ", \"bytes_sent\": " << st.bytes_sent << ", \"keys_pulled\": " << st.keys_pulled
        << ", \"keys_pushed\": " << st.keys_pushed << ", \"deferred_pulls\": " << st.deferred_pulls
        << ", \"max_staleness\": " << st.max_staleness << ", \"rows\": " << st.rows << "}";
  }
  out << "], \"evals\": [";
  for (std::size_t i = 0; i < r.evals.size(); ++i) {
    const auto& p = r.evals[i];
    out << (i ? ", " : "") << "{\"step\": " << p.step << ", \"train_seconds\": " << p.train_seconds
        << ", \"auc\": " << p.auc << ", \"logloss\": " << p.logloss << "}";
  }
  out << "]}\n";
  if (!out) fail(errc::io_error, cat("--report-json: writing '", path, "' failed"));
}
/// Builds the model the flags name and trains it (or runs one advisor probe: f.probe_out).
void train_model(const flags& f, const datasets& d) {
  if (f.model == "dlrm") {
    models::dlrm::config c;
    c.gemm = f.gemm;
    c.embedding_dim = f.dim;
    c.table_rows = f.model_table_rows();
    c.bottom_mlp.back() = f.dim;
    if (f.tiny) {
      c.bottom_mlp = {64, f.dim};
      c.top_mlp = {64, 1};
    }
    if (!f.bottom_mlp.empty()) {
      c.bottom_mlp = f.bottom_mlp;
      c.bottom_mlp.push_back(f.dim);
    }
    if (!f.top_mlp.empty()) {
      c.top_mlp = f.top_mlp;
      c.top_mlp.push_back(1);
    }
    // Row-wise Adagrad for the tables and for the MLPs (the same optimizer type: one
    // composition per strategy keeps the build time down), each with its own learning rate.
    optim::adagrad opt;
    opt.lr = f.lr > 0.0f ? f.lr : 0.02f;
    optim::adagrad dense_opt = opt;
    dense_opt.lr = f.dense_lr > 0.0f ? f.dense_lr : 0.01f;
    if (f.gpu < 0) {
      train_dlrm(f, c, opt, dense_opt, d);
    } else {
#if defined(STRATA_WITH_CUDA)
      // The same model on the GPU: same fields, same parameters, same trainer policies.
      const cuda::dlrm::config g{c, f.gpu};
      if (f.leader()) log_line(cat("ctr_train: DLRM's dense part on CUDA device ", f.gpu));
      train_gpu_dlrm(f, g, opt, dense_opt, d);
#else
      fail(errc::unsupported,
           "--gpu: this ctr_train was built without CUDA (no nvcc when it was configured); "
           "rebuild with the CUDA toolkit installed (-DSTRATA_CUDA=ON), or drop --gpu");
#endif
    }
  } else if (f.model == "wide_deep") {
    models::wide_deep::config c;
    c.gemm = f.gemm;
    c.deep_dim = f.dim;
    c.table_rows = f.model_table_rows();
    if (f.tiny) c.deep_mlp = {64, 1};
    if (!f.top_mlp.empty()) {
      c.deep_mlp = f.top_mlp;
      c.deep_mlp.push_back(1);
    }
    // As the Wide & Deep paper and its tutorials train it: Adagrad for the tables (the wide
    // ones start at zero, as a linear model's weights), Adam for the deep MLP.
    optim::adagrad opt;
    opt.lr = f.lr > 0.0f ? f.lr : 0.05f;
    optim::adam dense_opt;
    dense_opt.lr = f.dense_lr > 0.0f ? f.dense_lr : 0.001f;
    train_wide_deep(f, c, opt, dense_opt, d);
  } else {
    fail(errc::invalid_argument, cat("--model must be dlrm or wide_deep, got '", f.model, "'"));
  }
}

/// One advisor probe: `strategy` with `codec` trained here for `steps` steps, as threads and
/// without link emulation (pulls as messages, so every byte is counted).
probe_result probe_once(const flags& f, const datasets& d, const std::string& strategy,
                        const std::string& codec, std::size_t steps) {
  flags p = f;
  p.strategy = strategy;
  p.compressor = codec;
  p.process = nullptr;
  p.options.link = {};
  p.options.faults.clear();  // a rehearsed crash belongs to the training run, not its probes
  p.options.fail_rank = -1;
  p.options.fail_on_send = 0;
  p.options.in_process_pulls = false;
  p.options.progress = false;
  p.options.eval_every = 0;
  p.options.checkpoint_dir.clear();
  p.options.resume = false;
  p.options.resume_from.clear();
  p.options.trace_file.clear();
  p.options.max_steps = steps;
  p.report_json.clear();
  p.export_dir.clear();
  probe_result r;
  p.probe_out = &r;
  train_model(p, d);
  return r;
}

/// Probes `strategy` x `codec` twice (a short and a longer run: their difference is the cost
/// of the steps alone, without start-up) and returns the advisor's per-step measurement.
plan::measured_step probe(const flags& f, const datasets& d, const std::string& strategy,
                          const std::string& codec, std::size_t short_steps,
                          std::size_t long_steps) {
  const auto a = probe_once(f, d, strategy, codec, short_steps);
  const auto b = probe_once(f, d, strategy, codec, long_steps);
  STRATA_EXPECTS(b.report.steps > a.report.steps, "--advise: the probe of ", strategy, " ran ",
                 b.report.steps, " steps; it needs more than ", a.report.steps,
                 " (give more data: --synthetic or --epochs)");
  const double steps = static_cast<double>(b.report.steps - a.report.steps);
  const auto per_step = [&](auto x, auto y) { return (static_cast<double>(y) - x) / steps; };
  // W workers as threads on this machine's cores run each at cores / W of a host.
  const double cores = std::max(1u, std::thread::hardware_concurrency());
  const double dilation = std::max(1.0, f.options.workers / cores);
  plan::measured_step m;
  m.strategy = strategy;
  m.codec = codec;
  m.workers = f.options.workers;
  m.servers = strategy == "allreduce" ? 0 : f.options.servers;
  m.local_seconds = per_step(a.report.seconds, b.report.seconds) / dilation;
  const auto waiting = [](const train::train_report& r) {
    return r.phase_seconds[train::pull_phase] + r.phase_seconds[train::push_phase];
  };
  m.server_wait_seconds =
      strategy == "allreduce"
          ? 0.0
          : std::clamp(per_step(waiting(a.report), waiting(b.report)) / dilation, 0.0,
                       m.local_seconds);
  const double workers = f.options.workers;
  m.ring_bytes =
      per_step(a.report.bytes_worker_to_worker, b.report.bytes_worker_to_worker) / workers;
  m.push_bytes =
      per_step(a.report.bytes_worker_to_server, b.report.bytes_worker_to_server) / workers;
  m.pull_bytes =
      per_step(a.report.bytes_server_to_worker, b.report.bytes_server_to_worker) / workers;
  for (std::size_t s = 0; s < b.report.server_stats.size() && s < a.report.server_stats.size();
       ++s) {
    m.server_in_bytes = std::max(
        m.server_in_bytes,
        per_step(a.report.server_stats[s].bytes_received, b.report.server_stats[s].bytes_received));
    m.server_out_bytes = std::max(
        m.server_out_bytes,
        per_step(a.report.server_stats[s].bytes_sent, b.report.server_stats[s].bytes_sent));
  }
  if (strategy != "ps")
    m.dense_ring_bytes = 2 * (workers - 1) / workers * 4.0 * static_cast<double>(b.dense_floats);
  m.rank_ordered_sum = f.options.deterministic && codec == "none";
  return m;
}

/// --advise (and --strategy auto with a cluster description): probes every candidate, prints
/// the predicted ranking; auto then trains the fastest strategy with the given compressor.
void advise(flags& f, const datasets& d) {
  STRATA_EXPECTS(f.process == nullptr,
                 "--advise runs its probes as threads of one process; run it without mpirun "
                 "(with the cluster's --workers, --servers and --link-gbps)");
  // parse() refuses --advise without --link-gbps or with --gpu; --strategy auto comes here
  // only with both settled.
  const bool only_strategy = !f.advise;  // auto: the strategy only, with the given compressor
  std::vector<std::string> strategies;
  if (f.consistency == "sync") strategies.push_back("allreduce");
  if (f.options.servers >= 1) {
    strategies.push_back("ps");
    strategies.push_back("hybrid");
  } else {
    log_line(
        "--advise: --servers 0 (co-located shards) is not modelled; comparing allreduce "
        "only — pass --servers S for the parameter-server strategies");
  }
  STRATA_EXPECTS(!strategies.empty(), "--advise: with --consistency ", f.consistency,
                 " and --servers 0 there is nothing to compare (allreduce is sync only)");
  if (f.strategy_given) {
    STRATA_EXPECTS(std::ranges::find(strategies, f.strategy) != strategies.end(),
                   "--advise: ", "--strategy ", f.strategy, " cannot run here (--consistency ",
                   f.consistency, ", --servers ", f.options.servers, ")");
    strategies = {f.strategy};
  }
  std::vector<std::string> codecs = {"none", "fp16", "int8", "topk"};
  if (only_strategy || f.compressor_given) codecs = {f.compressor};
  const std::size_t available = f.options.epochs * steps_per_epoch(f, *d.train);
  const std::size_t long_steps = std::min<std::size_t>(8, available);
  const std::size_t short_steps = 2;
  STRATA_EXPECTS(long_steps > short_steps, "--advise: the data holds ", available,
                 " steps of --batch ", f.global_batch, "; the probes need at least ",
                 short_steps + 1, " (give more --synthetic rows or --epochs)");
  std::vector<std::pair<std::string, std::string>> pairs;  // (strategy, codec) to probe
  for (const auto& s : strategies)
    for (const auto& c : codecs)
      if (!(s == "ps" && c == "topk")) pairs.emplace_back(s, c);
  const auto started = std::chrono::steady_clock::now();
  // The process's first training run pays one-time costs that a real run spreads over
  // thousands of steps (first touches of the buffers malloc hands out, the GEMM library's
  // set-up for the model's shapes: oneDNN compiles its kernels). Landing in the first probe's
  // short run only, they came off its per-step difference: on experiment 1's quick grid
  // (docs/strategy-guide.md, "The probe's first run") the advisor read 3-13% low on compute-bound
  // rows. A discarded 1-step run of the first candidate takes them; later candidates showed no
  // such cost.
  if (!pairs.empty()) probe_once(f, d, pairs.front().first, pairs.front().second, 1);
  std::vector<plan::measured_step> candidates;
  for (const auto& [s, c] : pairs)
    candidates.push_back(probe(f, d, s, c, short_steps, long_steps));
  const double probe_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  plan::network net;
  net.bandwidth_bytes_per_second = f.options.link.bandwidth_bytes_per_second;
  net.latency_seconds = f.options.link.latency_seconds;
  const auto a = plan::advise(candidates, net);
  std::printf(
      "advisor: %d workers, %d servers, %.4g Gbit/s, %.4g us per message; %zu probes in "
      "%.1f s (%zu steps each, no link; per host: times / max(1, workers / %u cores))\n",
      f.options.workers, f.options.servers, net.bandwidth_bytes_per_second * 8 / 1e9,
      net.latency_seconds * 1e6, candidates.size(), probe_seconds, long_steps - short_steps,
      std::max(1u, std::thread::hardware_concurrency()));
  std::printf("%-10s %-6s %12s %12s %12s %14s %14s\n", "strategy", "codec", "step ms", "local ms",
              "network ms", "MB/worker", "MB busiest");
  for (const auto& p : a.ranked)
    std::printf("%-10s %-6s %12.3f %12.3f %12.3f %14.3f %14.3f\n", p.probe.strategy.c_str(),
                p.probe.codec.c_str(), 1e3 * p.step_seconds, 1e3 * p.probe.local_seconds,
                1e3 * p.network_seconds, p.worker_bytes / 1e6, p.busiest_machine_bytes / 1e6);
  std::printf("advice: %s\n", a.reason.c_str());
  if (!f.report_json.empty() && f.advise) {
    std::ofstream out(f.report_json);
    if (!out) fail(errc::io_error, cat("--report-json: cannot write '", f.report_json, "'"));
    out << "{\"advice\": [";
    for (std::size_t i = 0; i < a.ranked.size(); ++i) {
      const auto& p = a.ranked[i];
      out << (i ? ", " : "") << "{\"strategy\": \"" << p.probe.strategy << "\", \"codec\": \""
          << p.probe.codec << "\", \"step_ms\": " << 1e3 * p.step_seconds
          << ", \"local_ms\": " << 1e3 * p.probe.local_seconds
          << ", \"network_ms\": " << 1e3 * p.network_seconds
          << ", \"worker_bytes\": " << p.worker_bytes
          << ", \"busiest_bytes\": " << p.busiest_machine_bytes << "}";
    }
    out << "], \"probe_seconds\": " << probe_seconds << "}\n";
    if (!out) fail(errc::io_error, cat("--report-json: writing '", f.report_json, "' failed"));
  }
  if (only_strategy) {
    f.strategy = a.ranked.front().probe.strategy;
    log_line(cat("--strategy auto: the advisor chose ", f.strategy, " (", a.reason, ")"));
  }
}
}  // namespace

/// The final table of a run (leader), and the JSON report when --report-json asks.
void print_report(const flags& f, const train::train_report& r, const datasets& d,
                  std::uint64_t embedding_floats, std::size_t dense_floats) {
  std::printf("\n%-28s %s\n", "strategy", r.strategy.c_str());
  std::printf("%-28s %d workers, %d servers\n", "ranks", r.workers, r.servers);
  if (f.gpu >= 0)
    std::printf("%-28s cuBLAS (--gpu %d)\n", "dense GEMM", f.gpu);
  else
    std::printf("%-28s %s (%s)\n", "dense GEMM", std::string(nn::to_string(f.gemm)).c_str(),
                f.gemm_given ? "--gemm" : nn::default_gemm_choice().reason.c_str());
  std::printf("%-28s %zu (%zu samples, %.1f s, %.0f samples/s)\n", "steps", r.steps, r.samples,
              r.seconds, r.samples_per_second);
  std::printf("%-28s auc %.4f  logloss %.4f\n", "train (last segment, w0)", r.train_auc,
              r.train_loss);
  if (!r.evals.empty()) {
    const auto& e = r.evals.back();
    std::printf("%-28s auc %.4f  logloss %.4f  accuracy %.4f  (%zu samples)\n", "eval", e.auc,
                e.logloss, e.accuracy, e.samples);
    // The train figure averages every batch of the last segment: far above the eval loss, it
    // means the loss spiked during training (the model may have recovered by the end).
    if (e.logloss > 0 && r.train_loss > 1.5 * e.logloss)
      std::printf(
          "warning: the train logloss (%.4f, the mean over the last segment's batches) is "
          "%.1fx the eval logloss: training was unstable (loss spikes); lower --lr / "
          "--dense-lr, or pass --eval-every to see when\n",
          r.train_loss, r.train_loss / e.logloss);
  }
  if (d.teacher_auc >= 0) std::printf("%-28s auc %.4f\n", "teacher (ceiling)", d.teacher_auc);
  if (f.options.on_divergence == train::divergence_policy::skip_batch)
    std::printf("%-28s %zu (non-finite loss or gradients; zero gradients sent)\n",
                "batches dropped", r.skipped_batches);
  double total = 0;
  for (double s : r.phase_seconds)
    total += s;
  std::printf("%-28s", "time split (worker 0)");
  for (std::size_t p = 0; p < train::phase_count; ++p)
    std::printf(" %s %.1f%%", train::phase_names[p],
                total > 0 ? 100.0 * r.phase_seconds[p] / total : 0.0);
  std::printf("\n%-28s %.1f MiB\n", "bytes worker->worker", r.bytes_worker_to_worker / 1048576.0);
  std::printf("%-28s %.1f MiB\n", "bytes worker->server", r.bytes_worker_to_server / 1048576.0);
  std::printf("%-28s %.1f MiB\n", "bytes server->worker", r.bytes_server_to_worker / 1048576.0);
  for (std::size_t s = 0; s < r.server_stats.size(); ++s)
    std::printf("%-28s keys pulled %llu, pushed %llu, rows %llu\n", cat("server ", s).c_str(),
                static_cast<unsigned long long>(r.server_stats[s].keys_pulled),
                static_cast<unsigned long long>(r.server_stats[s].keys_pushed),
                static_cast<unsigned long long>(r.server_stats[s].rows));
  std::printf("%-28s %016llx / %016llx\n", "checksum dense / embeddings",
              static_cast<unsigned long long>(r.dense_checksum),
              static_cast<unsigned long long>(r.embedding_checksum));
  if (!f.report_json.empty())
    write_report_json(f.report_json, r, d.teacher_auc, embedding_floats, dense_floats);
}

}  // namespace ctr_train_example

using namespace ctr_train_example;

int main(int argc, char** argv) {
#if defined(STRATA_WITH_MPI)
  // Outside the try: a rank that fails must not reach MPI_Finalize while its peers still wait
  // for it (a server for requests, workers for replies) — end_job aborts the whole job instead.
  std::optional<mpi::environment> mpi_env;
#endif
  // After a failure has been printed: under mpirun with peers, MPI_Abort stops every rank (Open
  // MPI's launcher exits non-zero); otherwise the exit code is returned.
  const auto end_job = [&](int code) {
#if defined(STRATA_WITH_MPI)
    if (mpi_env && mpi_env->owns() && mpi::environment::world_size() > 1) {
      std::fflush(stdout);
      std::fflush(stderr);
      MPI_Abort(MPI_COMM_WORLD, code);
    }
#endif
    return code;
  };
  try {
    flags f = parse(argc, argv);
#if defined(STRATA_WITH_MPI)
    std::optional<mpi::transport> mpi_endpoint;
    std::optional<comm::crash_after<mpi::transport>> crashing;
    std::optional<comm::any_transport> endpoint;
    if (cli::launched_by_mpi()) {
      // One rank per process; --servers S makes the last S ranks servers (PS strategies).
      mpi_env.emplace(argc, argv);
      mpi::transport_options to;
      to.timeout_seconds = f.options.timeout_seconds;
      mpi_endpoint.emplace(to);
      const bool crash_here = f.crash_rank == mpi_endpoint->rank();
      crashing.emplace(*mpi_endpoint, crash_here ? f.crash_after : 0, f.crash_phase,
                       &ps::message_phase);
      f.options.faults.clear();  // the process dies instead (comm::crash_after)
      endpoint.emplace(*crashing);
      f.process = &*endpoint;
      STRATA_EXPECTS(f.export_dir.empty(),
                     "--export under mpirun: each process holds only its ranks' rows; write a "
                     "checkpoint (--checkpoint-dir) and export it with strata_export");
      const int size = mpi_endpoint->size();
      const bool ps_ranks = f.strategy != "allreduce" && f.options.servers > 0;
      STRATA_EXPECTS(!ps_ranks || size > f.options.servers, "ctr_train: ", size,
                     " MPI processes cannot hold ", f.options.servers, " servers and a worker");
      f.options.workers = ps_ranks ? size - f.options.servers : size;
      if (f.leader())
        log_line(cat("ctr_train: ", size, " MPI processes: ", f.options.workers, " workers",
                     ps_ranks ? cat(" + ", f.options.servers, " servers (the last ranks)") : ""));
    }
#else
    if (cli::launched_by_mpi())
      fail(errc::unsupported,
           "ctr_train was built without MPI (strata::mpi); install libopenmpi-dev and rebuild to "
           "run it under mpirun");
#endif
    // --batch is the global batch: the same samples per step (and so the same model, up to
    // float summation order) whatever the worker count.
    STRATA_EXPECTS(f.global_batch >= 1 && f.global_batch % f.options.workers == 0, "--batch ",
                   f.global_batch, " is the global batch and must split evenly over ",
                   f.options.workers, " workers; pass a multiple of ", f.options.workers);
    f.options.batch = f.global_batch / static_cast<std::size_t>(f.options.workers);
    for (const auto& [worker, factor] : f.stragglers) {
      STRATA_EXPECTS(worker < f.options.workers, "--straggler ", worker, ":", factor,
                     ": there are ", f.options.workers, " workers (0 to ", f.options.workers - 1,
                     "); name one of them");
      f.options.compute_slowdown.resize(static_cast<std::size_t>(f.options.workers), 1.0);
      f.options.compute_slowdown[static_cast<std::size_t>(worker)] = factor;
    }
    adopt_file_hashing(f);  // converted --data: the tables' rows from its files
    keep_vocabulary_with_checkpoints(f);
    // Servers the rows spread over: --servers, or one shard per worker when co-located.
    const int table_servers = f.options.servers > 0 ? f.options.servers : f.options.workers;
    if (f.leader()) report_table_memory(f, table_servers);
    check_table_memory(f, table_servers);
    const datasets d = load_data(f);
    STRATA_EXPECTS(d.train->size() > 0, "no training data");
    if (const std::size_t available = f.options.epochs * steps_per_epoch(f, *d.train);
        f.options.max_steps > available && f.leader())
      log_line(cat("--max-steps ", f.options.max_steps, " is beyond the data: ", f.options.epochs,
                   " epoch(s) of ", steps_per_epoch(f, *d.train), " steps; training stops at ",
                   available, " (raise --epochs to train longer)"));
    if (f.advise || (f.strategy == "auto" && f.link_given && f.process == nullptr && f.gpu < 0))
      advise(f, d);
    if (!f.advise) train_model(f, d);
    return 0;
  } catch (const std::bad_alloc&) {
    const memory_headroom room = current_memory_headroom();
    std::string rank;  // under mpirun, which process ran out
    for (const char* name : {"OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK"})
      if (const char* r = std::getenv(name); r != nullptr && rank.empty())
        rank = cat(" in MPI rank ", r);
    std::fprintf(stderr,
                 "ctr_train: out of memory%s (%s left) — the tables (--table-rows x --dim) or "
                 "the data (--synthetic / --data rows) do not fit; lower them, or spread the "
                 "tables over more server processes (mpiexec with --servers)\n",
                 rank.c_str(), room.describe().c_str());
    return end_job(1);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ctr_train: %s\n", e.what());
    return end_job(1);
  }
}
