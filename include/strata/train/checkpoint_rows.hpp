/// @file checkpoint_rows.hpp
/// What a training checkpoint holds, in the form every strategy and world size can load:
///
/// - `checkpoint_meta` (`state.ckpt`): the step, the model's dense size and row length, the
///   seed, the worker count and the optimizers' and strategy's names; `check_resumable_as`
///   refuses a checkpoint written for another model or other optimizers with a sentence.
/// - `row_records` (`rows-*.ckpt`): (table, key, row, optimizer state) records, table by table
///   — whoever holds rows (a worker's replica, a parameter server's stripe) writes its own;
///   `read_row_records` reads every such file of a checkpoint and checks each table's shape.
///
/// The dense parameters travel as one more table (index = the number of embedding tables) of
/// `dense_rows`. Residuals of lossy compressors are a worker's own (`worker-W.ckpt`), written
/// and read by the dense and sparse paths (`save_residual` / `load_residual`).
#pragma once

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "strata/core/error.hpp"
#include "strata/core/finite.hpp"
#include "strata/train/checkpoint.hpp"

namespace strata::train {

/// The identity of a training run, written once per checkpoint (`state.ckpt`).
struct checkpoint_meta {
  std::uint64_t step = 0;
  std::uint64_t dense_count = 0;  ///< dense parameters of the model
  std::uint64_t dense_row = 0;    ///< values per dense row
  std::uint64_t seed = 0;
  int workers = 0;
  std::string optimizer;        ///< the embedding tables'
  std::string dense_optimizer;  ///< the dense parameters'
  std::string strategy;
  /// The embedding tables, one "name rows dim" line each: with the seed (which also keys the
  /// data's hashing and order), what a resumed run must share with the one that wrote it.
  std::string tables;
  /// Every other file of the checkpoint (rows-*.ckpt, worker-*.ckpt), as written: resuming
  /// refuses a checkpoint where one is missing or an unlisted one is present.
  std::vector<std::string> files;
  /// Each listed file's size and stored checksum (empty in checkpoints written before seals):
  /// resuming refuses a file replaced by another (e.g. copied from another checkpoint).
  std::vector<file_seal> seals;
  /// The run that wrote it: drawn when a run starts fresh, kept by the runs that resume from
  /// it (0: not recorded).
  std::uint64_t run_id = 0;

  void write(const std::filesystem::path& file) const {
    checkpoint_writer out;
    out.add_value("meta/step", step);
    out.add_value("meta/dense_count", dense_count);
    out.add_value("meta/dense_row", dense_row);
    out.add_value("meta/seed", seed);
    out.add_value("meta/workers", workers);
    out.add("meta/optimizer", std::as_bytes(std::span(optimizer)));
    out.add("meta/dense_optimizer", std::as_bytes(std::span(dense_optimizer)));
    out.add("meta/strategy", std::as_bytes(std::span(strategy)));
    out.add("meta/tables", std::as_bytes(std::span(tables)));
    std::string list;
    for (const auto& name : files)
      list += name + "\n";
    out.add("meta/files", std::as_bytes(std::span(list)));
    if (!seals.empty()) {
      STRATA_EXPECTS(seals.size() == files.size(), "checkpoint_meta: ", seals.size(), " seals for ",
                     files.size(), " files");
      std::vector<std::uint64_t> flat;
      for (const auto& s : seals) {
        flat.push_back(s.bytes);
        flat.push_back(s.checksum);
      }
      out.add_values<std::uint64_t>("meta/file_seals", flat);
    }
    out.add_value("meta/run_id", run_id);
    out.commit(file);
  }

  [[nodiscard]] static checkpoint_meta read(const std::filesystem::path& file) {
    const checkpoint_reader in(file);
    const auto text = [&](const std::string& name) {
      const auto bytes = in.bytes(name);
      return std::string(reinterpret_cast<const char*>(bytes.data()), bytes.size());
    };
    checkpoint_meta meta;
    meta.step = in.value<std::uint64_t>("meta/step");
    meta.dense_count = in.value<std::uint64_t>("meta/dense_count");
    meta.dense_row = in.value<std::uint64_t>("meta/dense_row");
    meta.seed = in.value<std::uint64_t>("meta/seed");
    meta.workers = in.value<int>("meta/workers");
    meta.optimizer = text("meta/optimizer");
    // Checkpoints from before per-part optimizers have no meta/dense_optimizer: the tables'.
    meta.dense_optimizer =
        in.has("meta/dense_optimizer") ? text("meta/dense_optimizer") : meta.optimizer;
    meta.strategy = in.has("meta/strategy") ? text("meta/strategy") : std::string();
    meta.tables = in.has("meta/tables") ? text("meta/tables") : std::string();
    // Checkpoints from before the file list have none: nothing to check against.
    if (in.has("meta/files")) {
      const std::string list = text("meta/files");
      for (std::size_t at = 0, end; at < list.size(); at = end + 1) {
        end = list.find('\n', at);
        if (end == std::string::npos) end = list.size();
        if (end > at) meta.files.push_back(list.substr(at, end - at));
      }
    }
    if (in.has("meta/file_seals")) {
      const auto flat = in.values<std::uint64_t>("meta/file_seals", 2 * meta.files.size());
      for (std::size_t i = 0; i < meta.files.size(); ++i)
        meta.seals.push_back({flat[2 * i], flat[2 * i + 1]});
    }
    if (in.has("meta/run_id")) meta.run_id = in.value<std::uint64_t>("meta/run_id");
    return meta;
  }

  /// Refuses (errc::corrupt_data) a checkpoint directory `dir` that lacks a file this meta
  /// lists, or holds a rows-*.ckpt / worker-*.ckpt file it does not list (left by another run
  /// or copied in): resuming from it would silently give another model.
  void check_complete(const std::filesystem::path& dir) const {
    namespace fs = std::filesystem;
    if (files.empty()) return;  // written before checkpoints listed their files
    for (std::size_t i = 0; i < files.size(); ++i) {
      const auto& name = files[i];
      if (!fs::exists(dir / name))
        fail(errc::corrupt_data,
             cat("checkpoint ", dir.string(), " is incomplete: ", name,
                 " (listed in state.ckpt) is missing; resume from an older checkpoint (point "
                 "the checkpoint directory at its step-N folder)"));
      if (i < seals.size()) {
        const file_seal found = seal_of(dir / name);
        if (found != seals[i])
          fail(errc::corrupt_data,
               cat("checkpoint ", dir.string(), ": ", name, " is not the file this checkpoint ",
                   "wrote (", found.bytes, " bytes, checksum ", found.checksum, "; state.ckpt ",
                   "recorded ", seals[i].bytes, " bytes, checksum ", seals[i].checksum,
                   "): it was replaced or damaged; resume from an older checkpoint"));
      }
    }
    for (const auto& entry : fs::directory_iterator(dir)) {
      const std::string name = entry.path().filename().string();
      const bool ours = name.rfind("rows-", 0) == 0 || name.rfind("worker-", 0) == 0;
      if (ours && std::find(files.begin(), files.end(), name) == files.end())
        fail(errc::corrupt_data,
             cat("checkpoint ", dir.string(), " holds ", name,
                 ", which its state.ckpt does not list (left by another run or copied in?); "
                 "remove it or resume from another checkpoint"));
    }
  }

  /// Refuses (errc::corrupt_data) to resume `run` from this checkpoint (in `dir`) when it was
  /// written for another model size, other tables, another seed, other optimizers or another
  /// dense row length, naming the field. Strategy and worker count may differ: rows load under
  /// any placement.
  void check_resumable_as(const checkpoint_meta& run, const std::filesystem::path& dir) const {
    if (seed != run.seed)
      fail(errc::corrupt_data,
           cat("checkpoint ", dir.string(), " was written by a run with seed ", seed,
               "; this run has seed ", run.seed,
               " (the seed also keys the data's hashing and order, so the model would continue "
               "on other features): resume with seed ",
               seed));
    if (!tables.empty() && !run.tables.empty() && tables != run.tables) {
      const auto lines = [](const std::string& text) {
        std::vector<std::string> out;
        for (std::size_t at = 0, end; at < text.size(); at = end + 1) {
          end = text.find('\n', at);
          if (end == std::string::npos) end = text.size();
          out.push_back(text.substr(at, end - at));
        }
        return out;
      };
      const auto saved = lines(tables), now = lines(run.tables);
      std::size_t i = 0;
      while (i < saved.size() && i < now.size() && saved[i] == now[i])
        ++i;
      fail(errc::corrupt_data,
           cat("checkpoint ", dir.string(), " was written for other embedding tables: table ",
               i + 1, " was '", i < saved.size() ? saved[i] : std::string("(none)"),
               "' (name rows dim) and is '", i < now.size() ? now[i] : std::string("(none)"),
               "' in this run; resume with the table rows and dims it was written with"));
    }
    if (dense_count != run.dense_count)
      fail(errc::corrupt_data, cat("checkpoint ", dir.string(), " holds ", dense_count,
                                   " dense parameters but this model has ", run.dense_count,
                                   "; was it written for another model configuration?"));
    if (optimizer != run.optimizer || dense_optimizer != run.dense_optimizer ||
        dense_row != run.dense_row)
      fail(errc::corrupt_data,
           cat("checkpoint ", dir.string(), " was written with optimizers ", optimizer,
               " (tables) and ", dense_optimizer, " (dense) and dense_row ", dense_row,
               "; this run uses ", run.optimizer, ", ", run.dense_optimizer, " and ", run.dense_row,
               ": resume with the optimizers it was written with"));
  }
};

/// Rows of several tables as (key, row, state) records, collected in memory and written as one
/// `rows-*.ckpt` file (sections `tables`, and per table `tT/keys`, `tT/rows`, `tT/state`).
class row_records {
 public:
  explicit row_records(std::size_t tables) : tables_(tables) {}

  void add(std::size_t table, std::uint64_t key, std::span<const float> row,
           std::span<const float> state) {
    STRATA_EXPECTS(table < tables_.size(), "row_records::add: table ", table, " of ",
                   tables_.size());
    auto& t = tables_[table];
    t.keys.push_back(key);
    t.rows.insert(t.rows.end(), row.begin(), row.end());
    t.state.insert(t.state.end(), state.begin(), state.end());
  }
  /// `add` as a callable fn(table, key, row, state), for the row visitors that fill records.
  [[nodiscard]] auto adder() {
    return [this](std::size_t table, std::uint64_t key, std::span<const float> row,
                  std::span<const float> state) { add(table, key, row, state); };
  }
  [[nodiscard]] std::size_t tables() const noexcept { return tables_.size(); }
  [[nodiscard]] std::size_t rows(std::size_t table) const { return tables_.at(table).keys.size(); }

  /// Writes the records to `file`. Refuses (errc::diverged, nothing written) when a row or its
  /// optimizer state holds a non-finite value: a checkpoint is never written from a diverged
  /// model, so the last good one stays the newest.
  void commit(const std::filesystem::path& file) const {
    for (std::size_t t = 0; t < tables_.size(); ++t) {
      const auto& records = tables_[t];
      const std::size_t per_row =
          records.keys.empty() ? 0 : records.rows.size() / records.keys.size();
      const std::size_t state_per_row =
          records.keys.empty() ? 0 : records.state.size() / records.keys.size();
      const auto bad_row = [&](const std::vector<float>& values, std::size_t width) {
        const std::size_t at = strata::detail::first_non_finite(values);
        return at == values.size() || width == 0 ? records.keys.size() : at / width;
      };
      const std::size_t row =
          std::min(bad_row(records.rows, per_row), bad_row(records.state, state_per_row));
      if (row < records.keys.size())
        fail(errc::diverged,
             cat("refusing to write checkpoint file ", file.string(), ": table ", t,
                 (t + 1 == tables_.size() ? " (the dense parameters)" : ""), ", key ",
                 records.keys[row],
                 " holds a non-finite value (the model diverged); no checkpoint is written from "
                 "it and the last good one stays the newest"));
    }
    checkpoint_writer out;
    const std::uint64_t count = tables_.size();
    out.add_value("tables", count);
    for (std::size_t t = 0; t < tables_.size(); ++t) {
      out.add_values<std::uint64_t>(cat("t", t, "/keys"), tables_[t].keys);
      out.add_values<float>(cat("t", t, "/rows"), tables_[t].rows);
      out.add_values<float>(cat("t", t, "/state"), tables_[t].state);
    }
    out.commit(file);
  }

 private:
  struct table {
    std::vector<std::uint64_t> keys;
    std::vector<float> rows, state;
  };
  std::vector<table> tables_;
};

/// The shape a table's records must have: values per row and optimizer state floats per row.
struct row_shape {
  /// `state_floats` for a reader that does not use the state: not read, not checked (fn gets
  /// an empty state).
  static constexpr std::size_t any_state = static_cast<std::size_t>(-1);
  std::size_t dim = 0;
  std::size_t state_floats = 0;
};

/// Reads every `rows-*.ckpt` file of checkpoint `dir` (in name order) and calls
/// fn(table, key, row, state, file) for each record. Each file must hold `shapes.size()` tables
/// whose rows and states have the given shapes; otherwise errc::corrupt_data says which file
/// and table. A checkpoint without rows files is refused too. `fn` is type-erased (one call per
/// row, on the load path only): one copy of this function serves every trainer composition.
using row_record_sink = std::function<void(std::size_t, std::uint64_t, std::span<const float>,
                                           std::span<const float>, const std::filesystem::path&)>;
inline void read_row_records(const std::filesystem::path& dir, std::span<const row_shape> shapes,
                             const row_record_sink& fn) {
  namespace fs = std::filesystem;
  std::vector<fs::path> files;
  for (const auto& entry : fs::directory_iterator(dir))
    if (entry.path().filename().string().rfind("rows-", 0) == 0) files.push_back(entry.path());
  std::sort(files.begin(), files.end());
  if (files.empty())
    fail(errc::corrupt_data, cat("checkpoint ", dir.string(), " has no rows-*.ckpt files"));
  for (const auto& file : files) {
    const checkpoint_reader in(file);
    const auto tables = in.value<std::uint64_t>("tables");
    if (tables != shapes.size())
      fail(errc::corrupt_data,
           cat("checkpoint ", file.string(), " has ", tables == 0 ? 0 : tables - 1,
               " embedding tables but the model has ", shapes.size() - 1));
    for (std::size_t t = 0; t < shapes.size(); ++t) {
      const auto [dim, sf] = shapes[t];
      const auto keys = in.values<std::uint64_t>(cat("t", t, "/keys"));
      const auto rows = in.values<float>(cat("t", t, "/rows"), keys.size() * dim);
      const bool with_state = sf != row_shape::any_state;
      const auto state = with_state ? in.values<float>(cat("t", t, "/state"), keys.size() * sf)
                                    : std::vector<float>{};
      for (std::size_t i = 0; i < keys.size(); ++i)
        fn(t, keys[i], std::span<const float>(rows.data() + i * dim, dim),
           with_state ? std::span<const float>(state.data() + i * sf, sf)
                      : std::span<const float>{},
           file);
    }
  }
}

}  // namespace strata::train
