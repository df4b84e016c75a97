#!/usr/bin/env python3
"""PyTorch peers of bench/quality.sh, written the usual way, on the Criteo-format Adult files:
- Wide & Deep: wide = a zero-initialised weight per categorical id (every C column, crosses
  included) + bias, trained with Adagrad lr 0.05; deep = 16-dim embeddings of the categoricals
  (the crossed column C10 excluded) and the log(1 + x) integers, standardised, into an MLP
  256-128-1, trained with Adam lr 1e-3 (the Wide & Deep paper: FTRL/Adagrad for wide,
  AdaGrad/Adam for deep).
- DLRM: bottom MLP 64-16 over the integers, 16-dim embeddings, dot interaction, top MLP 64-1,
  Adagrad lr 0.01 for everything.
Batch 128, 2 threads, seed 0; evaluates after epochs 1 and 5. Prints one JSON list:
[{"name", "epochs", "auc", "logloss", "samples_per_s"}].
Usage: adult_torch.py TRAIN.tsv TEST.tsv   (run with bench/peers/venv.sh's peer-python)"""
import json
import sys
import time

import numpy as np
import torch
from torch import nn


def load(path, vocab=None):
    labels, ints, cats = [], [], []
    for line in open(path):
        f = line.rstrip("\n").split("\t")
        labels.append(float(f[0]))
        ints.append([max(float(v), 0.0) if v else 0.0 for v in f[1:14]])
        cats.append(f[14:40])
    used = [c for c in range(26) if any(row[c] for row in cats)]
    if vocab is None:
        vocab = [{} for _ in used]
        for row in cats:
            for j, c in enumerate(used):
                vocab[j].setdefault(row[c], len(vocab[j]) + 1)  # 0 = unseen
    ids = np.array([[vocab[j].get(row[c], 0) for j, c in enumerate(used)] for row in cats])
    return (torch.tensor(labels), torch.tensor(np.log1p(np.array(ints)), dtype=torch.float32),
            torch.tensor(ids), vocab)


def auc(scores, labels):
    order = np.argsort(scores, kind="mergesort")
    ranks = np.empty(len(scores))
    ranks[order] = np.arange(1, len(scores) + 1)
    pos = labels == 1
    return (ranks[pos].sum() - pos.sum() * (pos.sum() + 1) / 2) / (pos.sum() * (~pos).sum())


class WideDeep(nn.Module):
    def __init__(self, sizes, dense, deep_columns):
        super().__init__()
        self.deep_columns = deep_columns
        self.offsets = torch.tensor(np.cumsum([0] + sizes[:-1]))
        self.wide = nn.Embedding(sum(sizes), 1)
        nn.init.zeros_(self.wide.weight)
        self.bias = nn.Parameter(torch.zeros(1))
        self.deep = nn.ModuleList([nn.Embedding(sizes[c], 16) for c in deep_columns])
        self.mlp = nn.Sequential(nn.Linear(dense + 16 * len(deep_columns), 256), nn.ReLU(),
                                 nn.Linear(256, 128), nn.ReLU(), nn.Linear(128, 1))

    def forward(self, x, ids):
        wide = self.wide(ids + self.offsets).sum(dim=(1, 2)) + self.bias
        deep = torch.cat([x] + [e(ids[:, c]) for e, c in zip(self.deep, self.deep_columns)], 1)
        return wide + self.mlp(deep).squeeze(1)

    def groups(self):
        return [self.wide.weight, self.bias], list(self.deep.parameters()) + list(self.mlp.parameters())


class DLRM(nn.Module):
    def __init__(self, sizes, dense):
        super().__init__()
        self.bottom = nn.Sequential(nn.Linear(dense, 64), nn.ReLU(), nn.Linear(64, 16), nn.ReLU())
        self.tables = nn.ModuleList([nn.Embedding(s, 16) for s in sizes])
        for t in self.tables:
            nn.init.uniform_(t.weight, -(1 / t.num_embeddings) ** 0.5, (1 / t.num_embeddings) ** 0.5)
        f = len(sizes) + 1
        self.pairs = torch.triu_indices(f, f, offset=1)
        self.top = nn.Sequential(nn.Linear(16 + f * (f - 1) // 2, 64), nn.ReLU(), nn.Linear(64, 1))

    def forward(self, x, ids):
        z = self.bottom(x)
        vectors = torch.stack([z] + [t(ids[:, c]) for c, t in enumerate(self.tables)], 1)
        dots = torch.bmm(vectors, vectors.transpose(1, 2))[:, self.pairs[0], self.pairs[1]]
        return self.top(torch.cat([z, dots], 1)).squeeze(1)


def run(name, model, optimizers, train, test, epochs_to_report):
    y, x, ids = train
    ty, tx, tids = test
    loss_fn = nn.BCEWithLogitsLoss()
    generator = torch.Generator().manual_seed(0)
    results, seconds = [], 0.0
    for epoch in range(1, max(epochs_to_report) + 1):
        start = time.perf_counter()
        model.train()
        for batch in torch.randperm(len(y), generator=generator).split(128):
            loss = loss_fn(model(x[batch], ids[batch]), y[batch])
            for o in optimizers:
                o.zero_grad()
            loss.backward()
            for o in optimizers:
                o.step()
        seconds += time.perf_counter() - start
        if epoch in epochs_to_report:
            model.eval()
            with torch.no_grad():
                logits = model(tx, tids).double()
            p = torch.sigmoid(logits).clamp(1e-7, 1 - 1e-7)
            logloss = float(-(ty * p.log() + (1 - ty) * (1 - p).log()).mean())
            results.append({"name": name, "epochs": epoch, "auc": float(auc(logits.numpy(), ty.numpy())),
                            "logloss": logloss, "samples_per_s": epoch * len(y) / seconds})
    return results


def main():
    torch.set_num_threads(2)
    y, x, ids, vocab = load(sys.argv[1])
    ty, tx, tids, _ = load(sys.argv[2], vocab)
    mean, std = x.mean(0), x.std(0).clamp(min=1e-6)
    x, tx = (x - mean) / std, (tx - mean) / std
    sizes = [len(v) + 1 for v in vocab]
    # The crossed column, C10 (bench/quality/adult_to_criteo.py), as an index of the used columns
    # (C1..C17, every one used, so C10 is index 9).
    crosses = {9}
    results = []
    torch.manual_seed(0)
    wd = WideDeep(sizes, x.shape[1], [c for c in range(len(sizes)) if c not in crosses])
    wide, deep = wd.groups()
    results += run("pytorch wide_deep", wd, [torch.optim.Adagrad(wide, lr=0.05),
                                             torch.optim.Adam(deep, lr=1e-3)],
                   (y, x, ids), (ty, tx, tids), [1, 5])
    torch.manual_seed(0)
    dlrm = DLRM(sizes, x.shape[1])
    results += run("pytorch dlrm", dlrm, [torch.optim.Adagrad(dlrm.parameters(), lr=0.01)],
                   (y, x, ids), (ty, tx, tids), [1, 5])
    print(json.dumps(results))


if __name__ == "__main__":
    main()
