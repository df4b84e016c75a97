// serve::export_checkpoint / export_trainer and serve::predictor against the trainer: a small
// DLRM and Wide & Deep trained on Criteo-format TSV data (13 dense, 26 sparse features) under
// a parameter server with 2 servers and under ring allreduce; the predictor's fp32 outputs
// must equal the trainer's evaluation, quantized bundles keep the AUC, bad bundles and lines
// are refused with a clear message, concurrent callers get the serial answers.
#include <catch2/catch.hpp>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "strata/data/criteo.hpp"
#include "strata/data/synthetic.hpp"
#include "strata/embedding/local.hpp"
#include "strata/embedding/sharded.hpp"
#include "strata/models/dlrm.hpp"
#include "strata/models/wide_deep.hpp"
#include "strata/optim/adagrad.hpp"
#include "strata/serve.hpp"
#include "strata/train/evaluation.hpp"
#include "strata/train/trainer.hpp"
#include "support/catch_error.hpp"
#include "support/serve_fixtures.hpp"
#include "support/temp_dir.hpp"

using namespace strata;
using strata_test::catch_error;
using strata_test::contains;
using strata_test::temp_dir;
using namespace strata_test::serving;

namespace {

/// Reference logits from the trainer's in-memory state (not the checkpoint): a fresh model with
/// the trainer's dense parameters, fed every table in full — DLRM's initial rows (±sqrt(1/rows)
/// per table, core/row_init.hpp) overwritten by every row the trainer holds.
template <class Trainer>
std::vector<float> trainer_logits(const Trainer& trainer, typename Trainer::model_type::config c,
                                  const data::ctr_dataset& set) {
  using Model = typename Trainer::model_type;
  c.seed = seed;
  Model model(c);
  const auto dense = trainer.dense_parameters();
  std::copy(dense.begin(), dense.end(), model.parameters().begin());
  const auto specs = model.tables();
  std::vector<std::uint64_t> rows;
  for (const auto& s : specs)
    rows.push_back(s.rows);
  auto init = uniform_init::for_rows(seed, rows);
  if constexpr (std::is_same_v<Model, models::wide_deep>)
    for (std::size_t t = 0; t < specs.size(); ++t)
      if (model.zero_initialised(t)) init.table_scales[t] = uniform_init::zeros;
  std::vector<std::vector<float>> tables(specs.size());
  for (std::size_t t = 0; t < specs.size(); ++t) {
    tables[t].resize(specs[t].rows * specs[t].dim);
    for (std::uint64_t k = 0; k < specs[t].rows; ++k)
      init.fill(t, k, std::span(tables[t].data() + k * specs[t].dim, specs[t].dim));
  }
  trainer.for_each_embedding_row(
      [&](std::size_t t, std::uint64_t key, std::span<const float> row, std::span<const float>) {
        std::copy(row.begin(), row.end(), tables[t].begin() + key * specs[t].dim);
      });
  std::vector<float> out(set.size());
  data::ctr_batch b;
  std::vector<std::size_t> idx;
  std::vector<matrix<float>> gathered(specs.size());
  std::vector<matrix_view<const float>> views(specs.size());
  for (std::size_t first = 0; first < set.size(); first += batch) {
    const std::size_t n = std::min(batch, set.size() - first);
    idx.resize(n);
    std::iota(idx.begin(), idx.end(), first);
    set.gather(idx, b);
    for (std::size_t t = 0; t < specs.size(); ++t) {
      gathered[t] = matrix<float>(n, specs[t].dim);
      for (std::size_t i = 0; i < n; ++i) {
        const auto key = b.keys(i, model.input_column(t));
        std::copy_n(tables[t].begin() + key * specs[t].dim, specs[t].dim,
                    gathered[t].view().row(i).begin());
      }
      views[t] = gathered[t].view();
    }
    model.forward(models::ctr_inputs{b.dense.view(), views}, std::span(out.data() + first, n));
  }
  return out;
}

double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  REQUIRE(a.size() == b.size());
  double worst = 0;
  for (std::size_t i = 0; i < a.size(); ++i)
    worst = std::max(worst, std::abs(double(a[i]) - b[i]));
  return worst;
}

/// The files of two bundles are byte-identical (the manifests' size + checksum lists agree).
bool same_files(const std::filesystem::path& a, const std::filesystem::path& b) {
  const auto ma = serve::bundle_manifest::read(a), mb = serve::bundle_manifest::read(b);
  if (ma.files.size() != mb.files.size()) return false;
  for (std::size_t i = 0; i < ma.files.size(); ++i)
    if (ma.files[i].name != mb.files[i].name || ma.files[i].bytes != mb.files[i].bytes ||
        ma.files[i].checksum != mb.files[i].checksum)
      return false;
  return true;
}

/// AUC of the predictor's probabilities on the held-out set.
template <class Model>
double eval_auc(const serve::predictor<Model>& p, const data::ctr_dataset& set) {
  return train::score_predictions(run(p, set, 256), set.labels(), 0).auc;
}

}  // namespace

TEST_CASE(
    "fp32 bundles of a PS run (2 servers) and an allreduce run equal the trainer's evaluation",
    "[serve][predictor]") {
  const auto& d = shared_data();
  temp_dir work("serve_dlrm");
  optim::adagrad opt;
  opt.lr = 0.05f;

  ps_dlrm ps_run(dlrm_config(), opt, options(work.path / "ps-ckpt", 2));
  const auto ps_report = ps_run.fit(d.train, &d.eval);
  allreduce_dlrm ar_run(dlrm_config(), opt, options(work.path / "ar-ckpt", 2));
  const auto ar_report = ar_run.fit(d.train, &d.eval);
  REQUIRE(ps_report.steps == 40);
  REQUIRE(ps_report.evals.size() == 1);
  REQUIRE(ar_report.evals.size() == 1);
  REQUIRE(std::filesystem::exists(work.path / "ps-ckpt" / "step-40" / "rows-server-1.ckpt"));

  const auto ps_bundle = work.path / "ps-bundle", ar_bundle = work.path / "ar-bundle";
  const auto exported =
      serve::export_checkpoint<models::dlrm>(work.path / "ps-ckpt", dlrm_config(), ps_bundle);
  CHECK(exported.step == 40);
  CHECK(exported.rows_written > 0);
  CHECK(exported.rows_initialised > 0);  // a PS holds only the rows it served
  serve::export_checkpoint<models::dlrm>(work.path / "ar-ckpt" / "step-40", dlrm_config(),
                                         ar_bundle);

  // Sync PS and allreduce train the same model; the PS checkpoint lacks the untouched rows,
  // which the export fills with the trainer's initial values: the bundles are byte-identical
  // (the allreduce replica holds every row of every table).
  CHECK(same_files(ps_bundle, ar_bundle));

  for (const auto& [bundle, report, trainer_ref] :
       {std::tuple(ps_bundle, ps_report, trainer_logits(ps_run, dlrm_config(), d.eval)),
        std::tuple(ar_bundle, ar_report, trainer_logits(ar_run, dlrm_config(), d.eval))}) {
    INFO("bundle " << bundle.filename().string());
    const serve::predictor<models::dlrm> p(bundle);
    const auto logits = run(p, d.eval, batch);
    // The trainer's evaluation (same rows, same batches): the same scores exactly.
    const auto scored = train::score_predictions(logits, d.eval.labels(), 40);
    CHECK(scored.auc == report.evals.back().auc);
    CHECK(scored.logloss == Approx(report.evals.back().logloss).epsilon(1e-12));
    // Per sample, against the trainer's in-memory state: bitwise.
    CHECK(max_abs_diff(logits, trainer_ref) == 0.0);
    // Another batching rounds the MLPs' sums in another order at most: a few float ulps per
    // layer (oneDNN multiplies a 1-row batch with another kernel than a 40-row one: 1.4e-6
    // apart on these logits, ~6 ulps; Eigen and CBLAS stayed under 1e-6).
    CHECK(max_abs_diff(run(p, d.eval, 1000), logits) <= 1e-5);
    CHECK(max_abs_diff(run(p, d.eval, 1), logits) <= 1e-5);
  }

  // The final state exported straight from the trainer equals the checkpoint's export.
  serve::export_trainer(ps_run, dlrm_config(), work.path / "from-trainer", {}, 40);
  CHECK(same_files(work.path / "from-trainer", ps_bundle));
}

TEST_CASE("raw Criteo lines map to the keys training used", "[serve][lines]") {
  const auto& d = shared_data();
  temp_dir work("serve_lines");
  optim::adagrad opt;
  opt.lr = 0.05f;
  allreduce_dlrm run_(dlrm_config(), opt, options(work.path / "ckpt", 2));
  run_.fit(d.train);
  serve::export_checkpoint<models::dlrm>(work.path / "ckpt", dlrm_config(), work.path / "b");
  const serve::predictor<models::dlrm> p(work.path / "b");
  CHECK(p.manifest().hash_seed == seed);
  CHECK(p.manifest().missing_keys[5] == data::criteo_missing_key(5, table_rows, seed));

  const auto expected = run(p, d.eval, d.eval.size(), false);
  std::vector<std::string_view> lines(d.eval_lines.begin(), d.eval_lines.end());
  std::vector<float> got(lines.size());
  p.predict_lines(lines, got);
  CHECK(max_abs_diff(got, expected) == 0.0);
  // Without the label field (a serving request): the same answers.
  std::vector<std::string> unlabelled;
  for (const auto& line : d.eval_lines)
    unlabelled.push_back(line.substr(line.find('\t') + 1));
  std::vector<std::string_view> views(unlabelled.begin(), unlabelled.end());
  std::vector<float> got_unlabelled(views.size());
  p.predict_lines(views, got_unlabelled);
  CHECK(max_abs_diff(got_unlabelled, expected) == 0.0);

  // A line with the wrong field count is refused, naming the line and what a line must be.
  std::vector<std::string_view> bad = {lines[0], "1\t2\t3"};
  std::vector<float> two(2);
  const auto e = catch_error([&] { p.predict_lines(bad, two); });
  CHECK(e.code() == errc::invalid_argument);
  CHECK(contains(e.what(), "line 1 of the batch"));
  CHECK(contains(e.what(), "expected 40 tab-separated fields"));
  // A bad hex field too.
  std::string broken = d.eval_lines[0];
  broken.replace(broken.rfind('\t') + 1, std::string::npos, "xyz");
  bad = {broken};
  two.resize(1);
  CHECK(contains(catch_error([&] { p.predict_lines(bad, two); }).what(), "C26"));
}

TEST_CASE("a bundle with a frequency-threshold vocabulary maps raw lines as training did",
          "[serve][lines][vocabulary]") {
  const auto& d = shared_data();
  temp_dir work("serve_vocabulary");
  // The vocabulary of the training keys (hashed into 64 rows), and both sets read through it
  // as ctr_files reads converted days.
  data::ctr_key_counts counts(std::vector<std::uint64_t>(data::criteo_sparse_columns, table_rows));
  for (std::size_t i = 0; i < d.train.size(); ++i)
    for (std::size_t c = 0; c < data::criteo_sparse_columns; ++c)
      counts.add(c, d.train.keys()(i, c));
  const data::ctr_vocabulary v(counts, {.min_count = 60,
                                        .hash_seed = seed,
                                        .examples = d.train.size(),
                                        .counted_files = {"data.tsv"}});
  const auto vocabulary = work.path / "vocabulary.ctrv";
  v.save(vocabulary);
  const auto mapped = [&](const data::ctr_dataset& set) {
    std::vector<std::size_t> idx(set.size());
    std::iota(idx.begin(), idx.end(), std::size_t{0});
    auto b = set.gather(idx);
    for (std::size_t r = 0; r < b.size(); ++r)
      for (std::size_t c = 0; c < b.keys.cols(); ++c)
        b.keys(r, c) = v.map(c, b.keys(r, c));
    data::ctr_dataset out;
    out.append(b);
    return out;
  };
  const auto train_set = mapped(d.train), eval_set = mapped(d.eval);
  std::size_t rare = 0;
  for (std::size_t i = 0; i < eval_set.size(); ++i)
    for (std::size_t c = 0; c < data::criteo_sparse_columns; ++c)
      rare += eval_set.keys()(i, c) == v.rare_row(c);
  CHECK(rare > 0);  // the threshold does map some ids to the shared row

  auto config = dlrm_config();
  config.table_rows = v.table_rows();
  optim::adagrad opt;
  opt.lr = 0.05f;
  auto o = options({}, 0);
  o.checkpoint_every = 0;
  allreduce_dlrm trained(config, opt, o);
  trained.fit(train_set);
  serve::export_options e;
  e.vocabulary = vocabulary;
  serve::export_trainer(trained, config, work.path / "b", e, 40);
  const serve::predictor<models::dlrm> p(work.path / "b");
  REQUIRE(p.vocabulary() != nullptr);
  CHECK(p.vocabulary()->fingerprint() == v.fingerprint());
  CHECK(p.manifest().hash_rows ==
        std::vector<std::uint64_t>(data::criteo_sparse_columns, table_rows));
  CHECK(p.manifest().vocabulary_file == "vocabulary.ctrv");

  // Raw lines: hashed into 64 rows, then through the vocabulary — the keys training read.
  const auto expected = run(p, eval_set, eval_set.size(), false);
  std::vector<std::string_view> lines(d.eval_lines.begin(), d.eval_lines.end());
  std::vector<float> got(lines.size());
  p.predict_lines(lines, got);
  CHECK(max_abs_diff(got, expected) == 0.0);
  // and the predictor equals the trainer's state on the mapped keys, bitwise.
  CHECK(max_abs_diff(run(p, eval_set, batch), trainer_logits(trained, config, eval_set)) == 0.0);

  // A vocabulary that does not fit the model, or another seed, is refused at export.
  auto other = e;
  other.overwrite = true;
  other.hash_seed = seed + 1;
  auto err =
      catch_error([&] { serve::export_trainer(trained, config, work.path / "c", other, 40); });
  CHECK(err.code() == errc::invalid_argument);
  CHECK(contains(err.what(), "counted over keys hashed with seed"));
  allreduce_dlrm plain(dlrm_config(), opt, o);
  err = catch_error([&] { serve::export_trainer(plain, dlrm_config(), work.path / "c", e, 0); });
  CHECK(err.code() == errc::invalid_argument);
  CHECK(contains(err.what(), "maps sparse column 0 into"));
  // A damaged vocabulary inside the bundle fails its listed checksum.
  {
    std::fstream f(work.path / "b" / "vocabulary.ctrv",
                   std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(20);
    f.put('\x7f');
  }
  err = catch_error([&] { (void)serve::predictor<models::dlrm>(work.path / "b"); });
  CHECK(err.code() == errc::corrupt_data);
}

TEST_CASE("fp16 and int8 bundles keep the eval AUC within 0.001", "[serve][quantized]") {
  const auto& d = shared_data();
  temp_dir work("serve_quant");
  optim::adagrad opt;
  opt.lr = 0.05f;
  allreduce_dlrm dlrm_run(dlrm_config(), opt, options(work.path / "dlrm", 2));
  dlrm_run.fit(d.train);
  allreduce_wide_deep wd_run(wide_deep_config(), opt, options(work.path / "wd", 2));
  const auto wd_report = wd_run.fit(d.train, &d.eval);

  const auto check = [&]<class Model>(const std::filesystem::path& ckpt,
                                      const typename Model::config& c, const char* name) {
    serve::export_checkpoint<Model>(ckpt, c, work.path / cat(name, "-fp32"));
    const double fp32 = eval_auc(serve::predictor<Model>(work.path / cat(name, "-fp32")), d.eval);
    for (auto precision : {serve::precision::fp16, serve::precision::int8}) {
      const auto dir = work.path / cat(name, "-", serve::to_string(precision));
      serve::export_options quantized;
      quantized.rows = precision;
      const auto r = serve::export_checkpoint<Model>(ckpt, c, dir, quantized);
      const double auc = eval_auc(serve::predictor<Model>(dir), d.eval);
      std::printf("%s %s: eval AUC %.6f (fp32 %.6f, change %+.6f), %llu bytes\n", name,
                  std::string(serve::to_string(precision)).c_str(), auc, fp32, auc - fp32,
                  static_cast<unsigned long long>(r.bytes));
      CHECK(std::abs(auc - fp32) <= 0.001);
    }
    return fp32;
  };
  check.operator()<models::dlrm>(work.path / "dlrm", dlrm_config(), "dlrm");
  const double wd_fp32 =
      check.operator()<models::wide_deep>(work.path / "wd", wide_deep_config(), "wide_deep");
  // Wide & Deep's fp32 bundle is the trainer's evaluation too (its wide tables start at zero).
  CHECK(wd_fp32 == Approx(wd_report.evals.back().auc).margin(1e-3));
  const serve::predictor<models::wide_deep> wd(work.path / "wide_deep-fp32");
  CHECK(max_abs_diff(run(wd, d.eval, batch), trainer_logits(wd_run, wide_deep_config(), d.eval)) ==
        0.0);
  CHECK(train::score_predictions(run(wd, d.eval, batch), d.eval.labels(), 0).auc ==
        wd_report.evals.back().auc);
}

TEST_CASE("damaged bundles and bad inputs are refused with a clear message", "[serve][errors]") {
  namespace fs = std::filesystem;
  const auto& d = shared_data();
  temp_dir work("serve_errors");
  optim::adagrad opt;
  allreduce_dlrm run_(dlrm_config(), opt, options(work.path / "ckpt", 2));
  run_.fit(d.train);
  const auto good = work.path / "good";
  serve::export_checkpoint<models::dlrm>(work.path / "ckpt", dlrm_config(), good);
  const auto copy = [&](const char* name) {
    const auto dir = work.path / name;
    fs::copy(good, dir, fs::copy_options::recursive);
    return dir;
  };
  using P = serve::predictor<models::dlrm>;

  SECTION("missing table file") {
    const auto dir = copy("missing");
    fs::remove(dir / "table-003.fp32");
    const auto e = catch_error([&] { P p(dir); });
    CHECK(e.code() == errc::io_error);
    CHECK(contains(e.what(), "table-003.fp32"));
    CHECK(contains(e.what(), "export it again"));
  }
  SECTION("truncated table") {
    const auto dir = copy("truncated");
    fs::resize_file(dir / "table-007.fp32", 100);
    const auto e = catch_error([&] { P p(dir); });
    CHECK(e.code() == errc::corrupt_data);
    CHECK(contains(e.what(), "table-007.fp32 has 100 bytes but the manifest says 1024"));
    CHECK(contains(e.what(), "truncated"));
  }
  SECTION("wrong checksum") {
    const auto dir = copy("flipped");
    {
      std::fstream f(dir / "table-010.fp32", std::ios::in | std::ios::out | std::ios::binary);
      f.seekp(37);
      f.put('\x5a');
    }
    const auto e = catch_error([&] { P p(dir); });
    CHECK(e.code() == errc::corrupt_data);
    CHECK(contains(e.what(), "table-010.fp32 does not match its checksum"));
    // Without the checksum pass it opens (sizes still checked).
    CHECK_NOTHROW(P(dir, {.verify_checksums = false}));
  }
  SECTION("wrong manifest version, edited manifest, no manifest") {
    const auto dir = copy("version");
    std::ifstream in(dir / "manifest.txt");
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    in.close();
    auto v2 = text;
    v2.replace(0, v2.find('\n'), "strata-bundle 2");
    std::ofstream(dir / "manifest.txt", std::ios::trunc) << v2;
    auto e = catch_error([&] { P p(dir); });
    CHECK(e.code() == errc::unsupported);
    CHECK(contains(e.what(), "format version 2 but this strata reads version 1"));
    auto edited = text;
    edited.replace(edited.find("hash.seed 11"), 12, "hash.seed 12");
    std::ofstream(dir / "manifest.txt", std::ios::trunc) << edited;
    e = catch_error([&] { P p(dir); });
    CHECK(e.code() == errc::corrupt_data);
    CHECK(contains(e.what(), "fingerprint does not match"));
    fs::remove(dir / "manifest.txt");
    CHECK(catch_error([&] { P p(dir); }).code() == errc::io_error);
  }
  SECTION("wrong model, bad keys, wrong shapes") {
    auto e = catch_error([&] { serve::predictor<models::wide_deep> p(good); });
    CHECK(contains(e.what(), "holds a dlrm model, not a wide_deep"));
    const P p(good);
    data::ctr_batch b;
    const std::vector<std::size_t> idx = {0, 1};
    d.eval.gather(idx, b);
    b.keys(1, 4) = table_rows;
    std::vector<float> out(2);
    e = catch_error([&] { p.predict(b.dense.view(), b.keys.view(), out); });
    CHECK(e.code() == errc::out_of_range);
    CHECK(contains(e.what(), "sample 1, sparse column 4: key 64 is outside table 'C5'"));
    out.resize(3);
    CHECK(catch_error([&] { p.predict(b.dense.view(), b.keys.view(), out); }).code() ==
          errc::size_mismatch);
  }
  SECTION("export refuses another model shape and an existing bundle") {
    auto other = dlrm_config();
    other.top_mlp = {16, 1};
    auto e = catch_error([&] {
      serve::export_checkpoint<models::dlrm>(work.path / "ckpt", other, work.path / "x");
    });
    CHECK(e.code() == errc::corrupt_data);
    CHECK(contains(e.what(), "dense parameters"));
    other = dlrm_config();
    other.table_rows = {65};
    e = catch_error([&] {
      serve::export_checkpoint<models::dlrm>(work.path / "ckpt", other, work.path / "x");
    });
    CHECK(contains(e.what(), "holds the tables"));
    e = catch_error(
        [&] { serve::export_checkpoint<models::dlrm>(work.path / "ckpt", dlrm_config(), good); });
    CHECK(contains(e.what(), "already exists"));
    CHECK_FALSE(fs::exists(work.path / "x"));
  }
}

TEST_CASE("concurrent callers get the serial answers", "[serve][threads]") {
  const auto& d = shared_data();
  temp_dir work("serve_threads");
  optim::adagrad opt;
  opt.lr = 0.05f;
  allreduce_wide_deep run_(wide_deep_config(), opt, options(work.path / "ckpt", 2));
  run_.fit(d.train);
  serve::export_options int8;
  int8.rows = serve::precision::int8;
  serve::export_checkpoint<models::wide_deep>(work.path / "ckpt", wide_deep_config(),
                                              work.path / "b", int8);
  const serve::predictor<models::wide_deep> p(work.path / "b");
  const auto serial = run(p, d.eval, 37);
  std::vector<std::vector<float>> got(4);
  std::vector<std::thread> threads;
  for (std::size_t t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      for (int repeat = 0; repeat < 5; ++repeat)
        got[t] = run(p, d.eval, 37);
    });
  for (auto& t : threads)
    t.join();
  for (const auto& g : got)
    CHECK(g == serial);
  // A large batch split over oneTBB: each piece rounds like a call of its own.
  const serve::predictor<models::wide_deep> parallel(
      work.path / "b", {.parallel_min_batch = 100, .parallel_chunk = 37});
  CHECK(run(parallel, d.eval, d.eval.size()) == serial);
}
