#!/usr/bin/env python3
"""scikit-learn peers of bench/quality.sh on the Criteo-format Adult files: logistic regression
on one-hot categoricals + standardised log(1 + x) integers (what ctr_train's reader gives the
models), and HistGradientBoosting with the categoricals as categorical features.
Prints one JSON list: [{"name", "auc", "logloss", "samples_per_s"}] (samples/s = training rows
per second of fit time). Usage: adult_sklearn.py TRAIN.tsv TEST.tsv"""
import json
import sys
import time

import numpy as np
import pandas as pd
from sklearn.ensemble import HistGradientBoostingClassifier
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import log_loss, roc_auc_score
from sklearn.preprocessing import OneHotEncoder, StandardScaler
from scipy import sparse


def load(path):
    df = pd.read_csv(path, sep="\t", header=None, dtype=str, keep_default_na=False)
    y = df[0].astype(int).to_numpy()
    ints = df.iloc[:, 1:14].replace("", "0").astype(float).clip(lower=0)
    cats = df.iloc[:, 14:40]
    used = [c for c in cats.columns if (cats[c] != "").any()]
    return y, np.log1p(ints.to_numpy()), cats[used]


def report(name, model_fit, predict, y_test, rows):
    start = time.perf_counter()
    model_fit()
    seconds = time.perf_counter() - start
    p = np.clip(predict(), 1e-7, 1 - 1e-7)
    return {"name": name, "auc": roc_auc_score(y_test, p), "logloss": log_loss(y_test, p),
            "samples_per_s": rows / seconds}


def main():
    y_train, x_int, c_train = load(sys.argv[1])
    y_test, t_int, c_test = load(sys.argv[2])
    c_test = c_test[c_train.columns]
    scaler = StandardScaler().fit(x_int)
    onehot = OneHotEncoder(handle_unknown="ignore").fit(c_train)
    xtr = sparse.hstack([scaler.transform(x_int), onehot.transform(c_train)]).tocsr()
    xte = sparse.hstack([scaler.transform(t_int), onehot.transform(c_test)]).tocsr()
    lr = LogisticRegression(C=1.0, max_iter=2000)
    rows = []
    rows.append(report("sklearn logistic regression", lambda: lr.fit(xtr, y_train),
                       lambda: lr.predict_proba(xte)[:, 1], y_test, len(y_train)))
    # Gradient-boosted trees: categoricals as ordinal codes flagged categorical; trees find
    # interactions themselves, and HistGradientBoosting takes at most 255 levels, so any column
    # with more is left out (none in the current mapping: education x occupation has 217).
    codes_train, codes_test = [], []
    for c in c_train.columns:
        if c_train[c].nunique() > 255:
            continue
        levels = {v: i for i, v in enumerate(pd.unique(c_train[c]))}
        codes_train.append(c_train[c].map(levels).to_numpy())
        codes_test.append(c_test[c].map(levels).fillna(-1).to_numpy())
    gtr = np.column_stack([x_int] + codes_train)
    gte = np.column_stack([t_int] + codes_test).astype(float)
    gte[gte < 0] = np.nan
    categorical = [False] * x_int.shape[1] + [True] * len(codes_train)
    hgb = HistGradientBoostingClassifier(categorical_features=categorical, random_state=0)
    rows.append(report("sklearn HistGradientBoosting", lambda: hgb.fit(gtr, y_train),
                       lambda: hgb.predict_proba(gte)[:, 1], y_test, len(y_train)))
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
