#!/usr/bin/python3
"""PyTorch peer of bench_ctr: DLRM (Criteo Kaggle shape) trained end to end on strata's rows.

Runs under Debian's /usr/bin/python3 (torch 1.13: --embedding bag only) and under the bench venv's
peer-python (bench/peers/venv.sh: torch 2.14 + fbgemm_gpu CPU: --embedding bag or tbe).

Input (written by bench_ctr, little-endian): 16-byte magic b"STRATA-CTR-BIN1\\0"; uint64 n,
num_dense (13), num_sparse (26); float32 labels[n]; float32 dense[n * num_dense] (row-major,
already log(1 + max(x, 0))); int64 keys[n * num_sparse] (sample-major; each key already a row
index in [0, table_rows)).

Model, as strata's DLRM and the DLRM reference (facebookresearch/dlrm, dlrm_s_pytorch.py, Criteo
Kaggle: --arch-sparse-feature-size=16 --arch-mlp-bot=13-512-256-64-16 --arch-mlp-top=512-256-1
--arch-interaction-op=dot):
  26 tables of table_rows x dim, one key per feature and sample (sum pooling of one row);
  bottom MLP 13-512-256-64-16, ReLU after every layer (the reference's sigmoid_bot=-1);
  dot interaction of the 27 vectors [z, e_1..e_26]: the 351 dot products i > j (strict lower
  triangle, row-major as the reference's li/lj) after z -> 367 features;
  top MLP 367-512-256-1, ReLU between layers, none at the end: a logit;
  loss BCEWithLogits, mean over the batch. (The reference ends the top MLP with a Sigmoid and uses
  BCELoss on the probability: the same function, computed here the numerically stable way.)
Init as the reference (numpy RandomState(--seed), tables first, then bottom, then top): Linear
weights normal(0, sqrt(2 / (fan_in + fan_out))), biases normal(0, sqrt(1 / fan_out)), table rows
uniform(+-sqrt(1 / table_rows)). Same draws in both modes and under both torch versions.

Optimizer: Adagrad, lr --lr, eps 1e-10, initial accumulator 0, no lr decay, no weight decay, for
the tables and the dense MLPs. The reference's "--optimizer adagrad" is one torch.optim.Adagrad
(torch defaults, the same numbers) over all parameters, sparse table gradients included, with a
constant learning rate (its LR policy is a no-op without warm-up/decay steps). Here:
  --embedding bag: 26 nn.EmbeddingBag(rows, dim, mode="sum", sparse=True) (offsets = arange) and
    two torch.optim.Adagrad, one over the tables' sparse gradients, one over the dense parameters
    (Adagrad is per parameter, so this is the reference's update);
  --embedding tbe: one fbgemm_gpu SplitTableBatchedEmbeddingBagsCodegen holding all 26 tables on
    the host (EmbeddingLocation.HOST, ComputeDevice.CPU), pooling SUM, OptimType.EXACT_ADAGRAD
    fused into backward (learning_rate --lr, eps 1e-10; exact = duplicate keys of a batch summed
    into one row gradient first, as torch's sparse Adagrad does after coalesce()); feature-major
    indices/offsets; the dense part with torch.optim.Adagrad.

Training: torch.set_num_threads(--threads); --epochs passes over the training set in file order,
batches of --batch, the last partial batch kept ("dropped_last": false); --max-steps stops early.
The whole set is converted to tensors (batch-blocked, feature-major keys) before the clock starts;
"seconds" is the training loop only. Eval: batches of 4096 under no_grad, exact AUC (rank based,
ties averaged) and mean logloss.

Prints ONE JSON object on stdout:
  {"peer": "torch-<version>-embeddingbag" | "torch-<version>-fbgemm-tbe", "torch", "threads",
   "samples", "seconds", "samples_per_s", "auc", "logloss", ...}
Self-checks (stderr, exit 1, nothing on stdout): the first batch's loss is finite; eval AUC > 0.5.
"""
import argparse
import json
import math
import os
import sys
import time
import warnings

import numpy as np

try:
    import torch
except ImportError as e:  # the caller skips this peer
    sys.exit(f"dlrm_ctr_torch: torch not importable: {e}")

MAGIC = b"STRATA-CTR-BIN1\0"
EVAL_BATCH = 4096


def fail(msg):
    print(f"dlrm_ctr_torch: {msg}", file=sys.stderr)
    sys.exit(1)


def read_ctr(path, table_rows):
    """(labels [n], dense [n, num_dense], keys [n, num_sparse]) as numpy arrays."""
    try:
        with open(path, "rb") as f:
            head = f.read(40)
    except OSError as e:
        fail(f"cannot read {path}: {e}")
    if len(head) != 40 or head[:16] != MAGIC:
        fail(f"{path}: not a STRATA-CTR-BIN1 file")
    n, nd, ns = (int(v) for v in np.frombuffer(head, dtype="<u8", count=3, offset=16))
    want = 40 + 4 * n + 4 * n * nd + 8 * n * ns
    if os.path.getsize(path) != want:
        fail(f"{path}: {os.path.getsize(path)} bytes, header says {want}")
    labels = np.fromfile(path, dtype="<f4", count=n, offset=40)
    dense = np.fromfile(path, dtype="<f4", count=n * nd, offset=40 + 4 * n).reshape(n, nd)
    keys = np.fromfile(path, dtype="<i8", count=n * ns,
                       offset=40 + 4 * n + 4 * n * nd).reshape(n, ns)
    if n and (keys.min() < 0 or keys.max() >= table_rows):
        fail(f"{path}: keys outside [0, {table_rows}): min {keys.min()}, max {keys.max()}")
    native = lambda a: a.astype(a.dtype.newbyteorder("="), copy=False)  # noqa: E731
    return native(labels), native(dense), native(keys)


def linear(fan_in, fan_out, rng):
    layer = torch.nn.Linear(fan_in, fan_out)
    w = rng.normal(0.0, math.sqrt(2.0 / (fan_in + fan_out)), size=(fan_out, fan_in))
    b = rng.normal(0.0, math.sqrt(1.0 / fan_out), size=fan_out)
    with torch.no_grad():
        layer.weight.copy_(torch.from_numpy(w.astype(np.float32)))
        layer.bias.copy_(torch.from_numpy(b.astype(np.float32)))
    return layer


def mlp(sizes, relu_last, rng):
    layers = []
    for i in range(len(sizes) - 1):
        layers.append(linear(sizes[i], sizes[i + 1], rng))
        if i + 2 < len(sizes) or relu_last:
            layers.append(torch.nn.ReLU())
    return torch.nn.Sequential(*layers)


class DenseDLRM(torch.nn.Module):
    """Bottom MLP, dot interaction, top MLP; the embedding rows come in as B x F x dim."""

    def __init__(self, num_dense, num_sparse, dim, rng):
        super().__init__()
        n = num_sparse + 1
        self.bottom = mlp([num_dense, 512, 256, 64, dim], True, rng)
        self.top = mlp([dim + n * (n - 1) // 2, 512, 256, 1], False, rng)
        li, lj = torch.tril_indices(n, n, offset=-1)
        self.register_buffer("li", li)
        self.register_buffer("lj", lj)

    def forward(self, dense, emb):
        z = self.bottom(dense)
        t = torch.cat([z.unsqueeze(1), emb], dim=1)  # B x 27 x dim
        dots = torch.bmm(t, t.transpose(1, 2))
        return self.top(torch.cat([z, dots[:, self.li, self.lj]], dim=1)).squeeze(1)


class BagTables:
    """26 nn.EmbeddingBag(sum, sparse) + torch.optim.Adagrad over their sparse gradients."""

    def __init__(self, init_rows, dim, lr):
        self.bags = []
        for w in init_rows:
            bag = torch.nn.EmbeddingBag(w.shape[0], dim, mode="sum", sparse=True)
            with torch.no_grad():
                bag.weight.copy_(torch.from_numpy(w))
            self.bags.append(bag)
        self.opt = torch.optim.Adagrad([b.weight for b in self.bags], lr=lr, eps=1e-10)
        self.offsets = {}

    def __call__(self, keys_fm):  # F x B -> B x F x dim
        b = keys_fm.shape[1]
        if b not in self.offsets:
            self.offsets[b] = torch.arange(b, dtype=torch.int64)
        offsets = self.offsets[b]
        return torch.stack([bag(keys_fm[f], offsets) for f, bag in enumerate(self.bags)], dim=1)

    def zero_grad(self):
        self.opt.zero_grad(set_to_none=True)

    def step(self):
        self.opt.step()


class TBETables:
    """One FBGEMM TBE with all tables on the host; EXACT_ADAGRAD runs inside backward."""

    def __init__(self, init_rows, dim, lr):
        try:
            import fbgemm_gpu
            from fbgemm_gpu.split_embedding_configs import EmbOptimType as OptimType
            from fbgemm_gpu.split_table_batched_embeddings_ops_common import (
                EmbeddingLocation, PoolingMode)
            from fbgemm_gpu.split_table_batched_embeddings_ops_training import (
                ComputeDevice, SplitTableBatchedEmbeddingBagsCodegen)
        except ImportError as e:
            fail(f"--embedding tbe needs fbgemm_gpu ({e}); this is torch {torch.__version__} at "
                 f"{sys.executable}: run with the bench venv's peer-python (bench/peers/venv.sh)")
        self.version = fbgemm_gpu.__version__
        self.num_tables = len(init_rows)
        self.dim = dim
        self.tbe = SplitTableBatchedEmbeddingBagsCodegen(
            [(w.shape[0], dim, EmbeddingLocation.HOST, ComputeDevice.CPU) for w in init_rows],
            optimizer=OptimType.EXACT_ADAGRAD, learning_rate=lr, eps=1e-10,
            pooling_mode=PoolingMode.SUM, device=torch.device("cpu"))
        with torch.no_grad():
            for table, w in zip(self.tbe.split_embedding_weights(), init_rows):
                table.copy_(torch.from_numpy(w))
        self.offsets = {}

    def __call__(self, keys_fm):  # F x B (contiguous) -> B x F x dim
        b = keys_fm.shape[1]
        if b not in self.offsets:
            self.offsets[b] = torch.arange(self.num_tables * b + 1, dtype=torch.int64)
        out = self.tbe(keys_fm.reshape(-1), self.offsets[b])  # B x (F * dim)
        return out.view(b, self.num_tables, self.dim)

    def zero_grad(self):
        pass

    def step(self):
        pass  # fused into backward


def auc_exact(labels, scores):
    """Rank-based (Mann-Whitney) AUC, ties averaged."""
    n = scores.size
    pos = labels > 0.5
    n_pos = int(pos.sum())
    n_neg = n - n_pos
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    order = np.argsort(scores, kind="mergesort")
    s = scores[order]
    starts = np.concatenate(([0], np.flatnonzero(s[1:] != s[:-1]) + 1))
    ends = np.concatenate((starts[1:], [n]))
    ranks = np.empty(n, dtype=np.float64)
    ranks[order] = np.repeat((starts + 1 + ends) / 2.0, ends - starts)
    return float((ranks[pos].sum() - n_pos * (n_pos + 1) / 2.0) / (n_pos * n_neg))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--train", required=True)
    parser.add_argument("--eval", required=True)
    parser.add_argument("--table-rows", type=int, required=True)
    parser.add_argument("--dim", type=int, default=16)
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--lr", type=float, default=0.02)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--embedding", choices=["bag", "tbe"], default="bag")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-steps", type=int, default=0, help="stop after N steps (0: no limit)")
    args = parser.parse_args()
    if args.table_rows <= 0 or args.dim <= 0 or args.batch <= 0 or args.epochs <= 0:
        fail("--table-rows, --dim, --batch and --epochs must be positive")

    # torch 2.x, sparse Adagrad: "Sparse invariant checks are implicitly disabled" (noise)
    warnings.filterwarnings("ignore", message="Sparse invariant checks")
    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)
    rng = np.random.RandomState(args.seed)

    labels, dense, keys = read_ctr(args.train, args.table_rows)
    e_labels, e_dense, e_keys = read_ctr(args.eval, args.table_rows)
    n, num_dense = dense.shape
    num_sparse = keys.shape[1]
    if e_dense.shape[1] != num_dense or e_keys.shape[1] != num_sparse:
        fail("train and eval files have different column counts")
    if n == 0:
        fail(f"{args.train} has no samples")

    bound = math.sqrt(1.0 / args.table_rows)
    init_rows = [rng.uniform(-bound, bound, size=(args.table_rows, args.dim)).astype(np.float32)
                 for _ in range(num_sparse)]
    if args.embedding == "tbe":
        tables = TBETables(init_rows, args.dim, args.lr)
        peer = "fbgemm-tbe"
    else:
        tables = BagTables(init_rows, args.dim, args.lr)
        peer = "embeddingbag"
    del init_rows
    model = DenseDLRM(num_dense, num_sparse, args.dim, rng)
    opt = torch.optim.Adagrad(model.parameters(), lr=args.lr, eps=1e-10)
    loss_fn = torch.nn.BCEWithLogitsLoss()

    # Everything the loop reads, as tensors, up front: per batch a contiguous F x B key block.
    B = args.batch
    full = n // B
    batches = []
    t_labels = torch.from_numpy(labels)
    t_dense = torch.from_numpy(dense)
    t_keys = torch.from_numpy(keys)
    blocked = t_keys[:full * B].view(full, B, num_sparse).permute(0, 2, 1).contiguous()
    for b in range(full):
        batches.append((t_dense[b * B:(b + 1) * B], blocked[b], t_labels[b * B:(b + 1) * B]))
    if n % B:
        batches.append((t_dense[full * B:], t_keys[full * B:].t().contiguous(),
                        t_labels[full * B:]))

    steps = samples = 0
    first_loss = None
    start = time.perf_counter()
    for _ in range(args.epochs):
        for x, k, y in batches:
            if args.max_steps and steps >= args.max_steps:
                break
            loss = loss_fn(model(x, tables(k)), y)
            opt.zero_grad(set_to_none=True)
            tables.zero_grad()
            loss.backward()
            opt.step()
            tables.step()
            if first_loss is None:
                first_loss = loss.item()
                if not math.isfinite(first_loss):
                    fail(f"first batch loss is {first_loss}")
            steps += 1
            samples += y.shape[0]
    seconds = time.perf_counter() - start

    scores = []
    with torch.no_grad():
        for s in range(0, e_labels.shape[0], EVAL_BATCH):
            k = torch.from_numpy(e_keys[s:s + EVAL_BATCH]).t().contiguous()
            x = torch.from_numpy(e_dense[s:s + EVAL_BATCH])
            scores.append(model(x, tables(k)).double())
    logits = torch.cat(scores) if scores else torch.zeros(0, dtype=torch.float64)
    t_eval = torch.from_numpy(e_labels).double()
    logloss = float(torch.nn.functional.binary_cross_entropy_with_logits(logits, t_eval))
    auc = auc_exact(e_labels, logits.numpy())

    version = torch.__version__.split("+")[0]  # the venv's PyPI build says 2.14.1+cu130
    result = {"peer": f"torch-{version}-{peer}", "torch": torch.__version__,
              "threads": args.threads, "samples": samples, "seconds": seconds,
              "samples_per_s": samples / seconds if seconds > 0 else 0.0,
              "auc": auc, "logloss": logloss, "embedding": args.embedding,
              "batch": B, "steps": steps, "epochs": args.epochs, "dropped_last": False,
              "lr": args.lr, "table_rows": args.table_rows, "dim": args.dim,
              "first_loss": first_loss, "eval_samples": int(e_labels.shape[0])}
    if args.embedding == "tbe":
        result["fbgemm_gpu"] = tables.version
    if not auc > 0.5:
        fail(f"did not learn: eval AUC {auc} <= 0.5 ({json.dumps(result)})")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
