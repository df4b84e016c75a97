// strata_export: writes an inference bundle (serve/bundle.hpp) from a training checkpoint of
// any strategy and world size, and with --eval prints what the chosen precision costs in AUC;
// with --onnx also the ONNX model of the bundle (serve/onnx.hpp), or of an existing bundle.
//
//   strata_export ckpt bundle                              # fp32 tables
//   strata_export ckpt bundle --precision int8 --eval eval.tsv
//   strata_export ckpt bundle --onnx model.onnx            # bundle + ONNX (tables beside it)
//   strata_export bundle --onnx model.onnx                 # ONNX of an existing bundle
//
// The checkpoint records its tables and dense size but not the MLPs' shape: by default the
// model is ctr_train's (DLRM or Wide & Deep from the table names; the Criteo Kaggle MLPs or
// --tiny's, whichever has the checkpoint's dense size); other shapes are given with
// --bottom-mlp / --top-mlp / --deep-mlp.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <numeric>
#include <optional>
#include <span>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "strata/core/cli.hpp"
#include "strata/data/criteo.hpp"
#include "strata/data/ctr_vocabulary.hpp"
#include "strata/models/dlrm.hpp"
#include "strata/models/wide_deep.hpp"
#include "strata/serve.hpp"
#include "strata/serve/onnx.hpp"
#include "strata/train/checkpoint_dir.hpp"
#include "strata/train/checkpoint_rows.hpp"
#include "strata/train/evaluation.hpp"

namespace {

using namespace strata;

struct flags {
  std::filesystem::path checkpoint, bundle, eval, onnx;
  bool bundle_only = false;  ///< one positional: an existing bundle, exported to --onnx
  serve::precision rows = serve::precision::fp32;
  std::string model;  ///< empty: from the checkpoint's table names
  std::size_t dense_features = 13;
  std::optional<std::vector<std::size_t>> bottom_mlp, top_mlp, deep_mlp;
  std::optional<std::uint64_t> hash_seed;
  std::optional<std::filesystem::path> vocabulary;
  bool overwrite = false;
};

[[noreturn]] void usage(int code) {
  std::printf(
      "usage: strata_export CHECKPOINT_DIR BUNDLE_DIR [flags]\n"
      "       strata_export BUNDLE_DIR --onnx FILE.onnx [--overwrite]\n"
      "  CHECKPOINT_DIR                a checkpoint (step-N folder) or a checkpoint directory\n"
      "                                (its 'latest'), written by any strategy and world size\n"
      "  --onnx FILE.onnx              also write the bundle's ONNX model (dense float\n"
      "                                [batch,13] + sparse int64 [batch,26] -> probability\n"
      "                                [batch,1]; tables as FILE.table-NNN.f32 beside it, fp32);\n"
      "                                needs a build with libonnx-dev (target strata::onnx)\n"
      "  --precision fp32|fp16|int8    embedding rows in the bundle (int8: row-wise, scale +\n"
      "                                bias per row as FBGEMM's fused 8-bit tables)\n"
      "  --eval FILE.tsv               also print the eval AUC of fp32 and of --precision\n"
      "  --model dlrm|wide_deep        default: from the checkpoint's table names\n"
      "  --dense-features N            dense inputs (default 13, Criteo's)\n"
      "  --bottom-mlp A,B,.. --top-mlp A,B,..   DLRM's layer sizes (default: ctr_train's,\n"
      "                                Criteo Kaggle or --tiny, whichever has the checkpoint's\n"
      "                                dense size)\n"
      "  --deep-mlp A,B,..             Wide & Deep's deep layers (default: ctr_train's)\n"
      "  --hash-seed S                 feature hashing seed (default: the run's seed, as\n"
      "                                ctr_train hashes its data)\n"
      "  --vocabulary FILE             the vocabulary.ctrv the run's converted data was read\n"
      "                                through (strata_convert --min-count): copied into the\n"
      "                                bundle so raw lines map to rows as in training (default:\n"
      "                                the one ctr_train keeps beside its checkpoints)\n"
      "  --overwrite                   replace an existing BUNDLE_DIR (and ONNX files)\n");
  std::exit(code);
}

std::vector<std::size_t> parse_sizes(std::string_view flag, const std::string& text) {
  std::vector<std::size_t> sizes;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ','))
    sizes.push_back(cli::parse_integer(flag, item, std::size_t{1}, std::size_t{1} << 20));
  if (sizes.empty())
    fail(errc::invalid_argument, cat(flag, ": '", text, "' lists no layer sizes (e.g. 64,16)"));
  return sizes;
}

flags parse(int argc, char** argv) {
  flags f;
  std::vector<std::string> positional;
  std::vector<std::string> checkpoint_flags;  // given flags that only a checkpoint export uses
  for (int i = 1; i < argc; ++i) {
    const std::string_view a = argv[i];
    const auto value = [&] { return cli::flag_value(argc, argv, i); };
    if (a.starts_with("--") && a != "--onnx" && a != "--overwrite" && a != "--help")
      checkpoint_flags.emplace_back(a);
    if (a == "--help" || a == "-h")
      usage(0);
    else if (a == "--onnx")
      f.onnx = value();
    else if (a == "--precision")
      f.rows = *serve::parse_precision(cli::parse_name(a, value(), {"fp32", "fp16", "int8"}));
    else if (a == "--eval")
      f.eval = value();
    else if (a == "--model")
      f.model = cli::parse_name(a, value(), {"dlrm", "wide_deep"});
    else if (a == "--dense-features")
      f.dense_features = cli::parse_integer(a, value(), std::size_t{1}, std::size_t{1} << 20);
    else if (a == "--bottom-mlp")
      f.bottom_mlp = parse_sizes(a, value());
    else if (a == "--top-mlp")
      f.top_mlp = parse_sizes(a, value());
    else if (a == "--deep-mlp")
      f.deep_mlp = parse_sizes(a, value());
    else if (a == "--hash-seed")
      f.hash_seed = cli::parse_integer(a, value(), std::uint64_t{0}, ~std::uint64_t{0});
    else if (a == "--vocabulary")
      f.vocabulary = value();
    else if (a == "--overwrite")
      f.overwrite = true;
    else if (a.size() > 1 && a[0] == '-')
      fail(errc::invalid_argument, cat("unknown flag '", a, "'; see --help"));
    else
      positional.emplace_back(a);
  }
  if (!f.onnx.empty() && !serve::onnx_available)
    serve::detail::onnx_unavailable("strata_export --onnx");  // before anything is written
  if (positional.size() == 1 && !f.onnx.empty()) {            // an existing bundle, to ONNX
    f.bundle = positional[0];
    f.bundle_only = true;
    if (!std::filesystem::exists(f.bundle / "manifest.txt"))
      fail(errc::invalid_argument,
           cat(f.bundle.string(),
               " is not an inference bundle (no manifest.txt); export a checkpoint with "
               "strata_export CHECKPOINT_DIR BUNDLE_DIR --onnx FILE"));
    if (!checkpoint_flags.empty())
      fail(errc::invalid_argument,
           cat(checkpoint_flags.front(),
               " applies to a checkpoint export; an existing bundle goes to ONNX as it is "
               "(strata_export BUNDLE_DIR --onnx FILE [--overwrite])"));
    return f;
  }
  if (positional.size() != 2)
    fail(errc::invalid_argument,
         cat("strata_export needs CHECKPOINT_DIR and BUNDLE_DIR (got ", positional.size(),
             " names), or BUNDLE_DIR with --onnx FILE; see --help"));
  f.checkpoint = positional[0];
  f.bundle = positional[1];
  if (!f.eval.empty() && !std::filesystem::exists(f.eval))
    fail(errc::invalid_argument, cat("--eval ", f.eval.string(), ": no such file"));
  return f;
}

/// The checkpoint's tables ("name rows dim" lines).
struct table_line {
  std::string name;
  std::uint64_t rows = 0;
  std::size_t dim = 0;
};
std::vector<table_line> tables_of(const train::checkpoint_meta& meta) {
  std::vector<table_line> out;
  std::istringstream in(meta.tables);
  table_line t;
  while (in >> t.name >> t.rows >> t.dim)
    out.push_back(t);
  return out;
}

/// The first of `candidates` whose dense size is the checkpoint's; else a sentence.
template <class Model>
typename Model::config pick(const std::vector<typename Model::config>& candidates,
                            const train::checkpoint_meta& meta, const char* flags_hint) {
  std::string sizes;
  for (const auto& c : candidates) {
    const Model m(c);
    if (m.parameters().size() == meta.dense_count) return c;
    sizes += cat(sizes.empty() ? "" : ", ", m.parameters().size());
  }
  fail(errc::invalid_argument, cat("the checkpoint holds ", meta.dense_count,
                                   " dense parameters but the ", serve::model_traits<Model>::kind,
                                   " shapes tried have ", sizes, "; give the run's ", flags_hint));
}

template <class Model>
void evaluate(const flags& f, const std::filesystem::path& fp32_bundle) {
  const serve::predictor<Model> fp32(fp32_bundle), chosen(f.bundle);
  const auto& m = chosen.manifest();
  data::criteo_summary summary;
  const auto set =
      data::load_criteo(f.eval, {.table_rows = m.hash_rows, .hash_seed = m.hash_seed}, &summary);
  STRATA_EXPECTS(set.size() > 0, "--eval ", f.eval.string(), " holds no examples");
  std::vector<float> a(set.size()), b(set.size());
  data::ctr_batch batch;
  std::vector<std::size_t> idx;
  for (std::size_t first = 0; first < set.size(); first += 4096) {
    const std::size_t n = std::min<std::size_t>(4096, set.size() - first);
    idx.resize(n);
    std::iota(idx.begin(), idx.end(), first);
    set.gather(idx, batch);
    if (const auto* v = chosen.vocabulary())  // the TSV's hashed keys → rows, as in training
      for (std::size_t r = 0; r < n; ++r)
        for (std::size_t c = 0; c < batch.keys.cols(); ++c)
          batch.keys(r, c) = v->map(c, batch.keys(r, c));
    fp32.predict_logits(batch.dense.view(), batch.keys.view(), std::span(a.data() + first, n));
    chosen.predict_logits(batch.dense.view(), batch.keys.view(), std::span(b.data() + first, n));
  }
  const auto sa = train::score_predictions(a, set.labels(), m.step);
  const auto sb = train::score_predictions(b, set.labels(), m.step);
  const std::string name(serve::to_string(f.rows));
  std::printf(
      "eval %s (%zu samples): AUC fp32 %.6f, %s %.6f, change %+.6f; logloss fp32 %.6f, "
      "%s %.6f\n",
      f.eval.string().c_str(), set.size(), sa.auc, name.c_str(), sb.auc, sb.auc - sa.auc,
      sa.logloss, name.c_str(), sb.logloss);
}

/// Writes f.onnx from bundle f.bundle and says what it wrote.
void export_onnx(const flags& f) {
  const auto r = serve::export_onnx(f.bundle, f.onnx, {.overwrite = f.overwrite});
  std::printf("onnx %s: %zu nodes, %llu bytes + %zu fp32 table files (%llu bytes) beside it\n",
              r.model.string().c_str(), r.nodes, static_cast<unsigned long long>(r.model_bytes),
              r.data_files.size(), static_cast<unsigned long long>(r.data_bytes));
}

template <class Model>
void run(const flags& f, const typename Model::config& config) {
  if (!f.onnx.empty())  // refuse an existing ONNX file before the bundle is written
    serve::detail::check_onnx_target(f.onnx, Model(config).tables().size(), f.overwrite);
  serve::export_options options;
  options.rows = f.rows;
  options.hash_seed = f.hash_seed;
  options.vocabulary = f.vocabulary;
  // ctr_train keeps the vocabulary its data was read through beside its checkpoints.
  for (const auto& dir : {f.checkpoint, f.checkpoint.parent_path()}) {
    const auto kept = dir / std::string(data::ctr_vocabulary_name);
    if (dir.empty() || !std::filesystem::exists(kept)) continue;
    if (!options.vocabulary) {
      options.vocabulary = kept;
      std::printf("vocabulary: %s (kept with the checkpoints)\n", kept.string().c_str());
    } else if (data::ctr_vocabulary::load(*options.vocabulary).fingerprint() !=
               data::ctr_vocabulary::load(kept).fingerprint()) {
      fail(errc::invalid_argument,
           cat("--vocabulary ", options.vocabulary->string(),
               " is not the vocabulary the checkpoints were trained through (", kept.string(),
               "); drop --vocabulary"));
    }
    break;
  }
  options.overwrite = f.overwrite;
  const auto r = serve::export_checkpoint<Model>(f.checkpoint, config, f.bundle, options);
  std::printf(
      "bundle %s: %s, %s rows, step %llu, %llu bytes (%zu rows trained, %zu at their "
      "initial value), fingerprint %s\n",
      r.dir.string().c_str(), std::string(serve::model_traits<Model>::kind).c_str(),
      std::string(serve::to_string(f.rows)).c_str(), static_cast<unsigned long long>(r.step),
      static_cast<unsigned long long>(r.bytes), r.rows_written, r.rows_initialised,
      serve::bundle_manifest::hex(r.fingerprint).c_str());
  if (!f.onnx.empty()) export_onnx(f);
  if (f.eval.empty()) return;
  if (f.rows == serve::precision::fp32) return evaluate<Model>(f, f.bundle);
  // The fp32 reference, exported beside the bundle and removed afterwards.
  const auto reference = std::filesystem::path(f.bundle.string() + ".fp32-reference");
  serve::export_options fp32 = options;
  fp32.rows = serve::precision::fp32;
  fp32.overwrite = true;
  serve::export_checkpoint<Model>(f.checkpoint, config, reference, fp32);
  try {
    evaluate<Model>(f, reference);
  } catch (...) {
    std::filesystem::remove_all(reference);
    throw;
  }
  std::filesystem::remove_all(reference);
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const flags f = parse(argc, argv);
    if (f.bundle_only) {
      export_onnx(f);
      return 0;
    }
    const auto dir = train::checkpoint_directory(f.checkpoint).latest();
    const auto meta = train::checkpoint_meta::read(dir / "state.ckpt");
    const auto tables = tables_of(meta);
    if (tables.empty())
      fail(errc::invalid_argument,
           cat("checkpoint ", dir.string(),
               " does not list its tables (written by an older strata); export it from C++ with "
               "serve::export_checkpoint and the model's configuration"));
    std::string model = f.model;
    if (model.empty()) model = tables[0].name.rfind("wide_", 0) == 0 ? "wide_deep" : "dlrm";
    std::vector<std::uint64_t> rows;
    if (model == "dlrm") {
      for (const auto& t : tables)
        rows.push_back(t.rows);
      models::dlrm::config c;
      c.dense_features = f.dense_features;
      c.sparse_features = tables.size();
      c.embedding_dim = tables[0].dim;
      c.table_rows = rows;
      std::vector<models::dlrm::config> candidates;
      if (f.bottom_mlp || f.top_mlp) {
        if (f.bottom_mlp) c.bottom_mlp = *f.bottom_mlp;
        if (f.top_mlp) c.top_mlp = *f.top_mlp;
        candidates.push_back(c);
      } else {
        c.bottom_mlp.back() = c.embedding_dim;  // ctr_train's default
        candidates.push_back(c);
        c.bottom_mlp = {64, c.embedding_dim};  // ctr_train --tiny
        c.top_mlp = {64, 1};
        candidates.push_back(c);
      }
      run<models::dlrm>(f, pick<models::dlrm>(candidates, meta, "--bottom-mlp and --top-mlp"));
    } else {
      const std::size_t features = tables.size() / 2;
      for (std::size_t t = 0; t < features; ++t)
        rows.push_back(tables[t].rows);
      models::wide_deep::config c;
      c.dense_features = f.dense_features;
      c.sparse_features = features;
      c.deep_dim = tables.back().dim;
      c.table_rows = rows;
      std::vector<models::wide_deep::config> candidates;
      if (f.deep_mlp) {
        c.deep_mlp = *f.deep_mlp;
        candidates.push_back(c);
      } else {
        candidates.push_back(c);  // ctr_train's default
        c.deep_mlp = {64, 1};     // ctr_train --tiny
        candidates.push_back(c);
      }
      run<models::wide_deep>(f, pick<models::wide_deep>(candidates, meta, "--deep-mlp"));
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "strata_export: %s\n", e.what());
    return 1;
  }
}
