#!/usr/bin/env python3
"""FBGEMM peer of bench_embedding: SplitTableBatchedEmbeddingBagsCodegen (TBE) on the CPU.

Run it with the bench venv's interpreter (bench/peers/venv.sh prints its path: torch 2.14 +
fbgemm-gpu-cpu from PyPI). Same CLI and output as embeddingbag_torch.py. One table of
--rows x --dim on the host (EmbeddingLocation.HOST, ComputeDevice.CPU), pooling SUM, the optimizer
fused into backward:
  --optimizer sgd     : OptimType.EXACT_SGD, lr 1e-3 (default; what bench_embedding compares with)
  --optimizer adagrad : OptimType.EXACT_ADAGRAD (per-element accumulators, like torch.optim.Adagrad
                        and strata's optim::adagrad; not EXACT_ROWWISE_ADAGRAD), lr 1e-3, eps 1e-10
Reads the bench's cases (keys and CSR offsets as little-endian uint64 files; offsets have
bags + 1 entries, include_last_offset semantics, which is TBE's own offsets format for one table)
and times
  forward : tbe(keys, offsets)                          (pooled lookup, under no_grad)
  backward: out.backward(d_out)                         (the fused sparse update of the table)
with torch.set_num_threads(t) for each t in --threads, and prints one JSON object on stdout:
  {"torch": version, "peer": "fbgemm_gpu-<version>", "optimizer",
   "results": [{"case", "threads", "forward_rows_per_s", "backward_rows_per_s"}]}
rows/s = keys per second (one gathered / updated row per key), best of --repeats runs.
"""
import argparse
import json
import sys
import time

import numpy as np
import torch

try:
    import fbgemm_gpu
    from fbgemm_gpu.split_embedding_configs import EmbOptimType as OptimType
    from fbgemm_gpu.split_table_batched_embeddings_ops_common import (
        EmbeddingLocation, PoolingMode)
    from fbgemm_gpu.split_table_batched_embeddings_ops_training import (
        ComputeDevice, SplitTableBatchedEmbeddingBagsCodegen)
except ImportError as e:  # the caller skips this peer
    sys.exit(f"embedding_tbe: fbgemm_gpu not importable ({e}) with torch {torch.__version__} at "
             f"{sys.executable}: run with the bench venv's peer-python (bench/peers/venv.sh)")

LR = 1e-3


def best_seconds(fn, repeats):
    fn()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, required=True)
    parser.add_argument("--dim", type=int, required=True)
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--optimizer", choices=["sgd", "adagrad"], default="sgd")
    parser.add_argument("--case", action="append", default=[],
                        help="name:keys_file:offsets_file (repeatable)")
    args = parser.parse_args()

    torch.manual_seed(0)
    if args.optimizer == "sgd":
        opt = dict(optimizer=OptimType.EXACT_SGD, learning_rate=LR)
    else:
        opt = dict(optimizer=OptimType.EXACT_ADAGRAD, learning_rate=LR, eps=1e-10)
    tbe = SplitTableBatchedEmbeddingBagsCodegen(
        [(args.rows, args.dim, EmbeddingLocation.HOST, ComputeDevice.CPU)],
        pooling_mode=PoolingMode.SUM, device=torch.device("cpu"), **opt)
    results = []
    for spec in args.case:
        name, keys_file, offsets_file = spec.split(":")
        keys = torch.from_numpy(np.fromfile(keys_file, dtype="<u8").astype(np.int64))
        offsets = torch.from_numpy(np.fromfile(offsets_file, dtype="<u8").astype(np.int64))
        bags = offsets.numel() - 1
        if bags < 1 or int(offsets[0]) != 0 or int(offsets[-1]) != keys.numel():
            sys.exit(f"embedding_tbe: {offsets_file}: not CSR offsets of {keys.numel()} keys")
        if keys.numel() and (int(keys.min()) < 0 or int(keys.max()) >= args.rows):
            sys.exit(f"embedding_tbe: {keys_file}: keys outside [0, {args.rows})")
        d_out = torch.full((bags, args.dim), 1e-3)
        with torch.no_grad():
            check = tbe(keys, offsets)
        if tuple(check.shape) != (bags, args.dim):
            sys.exit(f"embedding_tbe: output shape {tuple(check.shape)} != {(bags, args.dim)}")
        for threads in [int(t) for t in args.threads.split(",")]:
            torch.set_num_threads(threads)

            def forward():
                with torch.no_grad():
                    tbe(keys, offsets)

            out = tbe(keys, offsets)

            def backward():
                out.backward(d_out, retain_graph=True)

            fwd = best_seconds(forward, args.repeats)
            bwd = best_seconds(backward, args.repeats)
            results.append({"case": name, "threads": threads,
                            "forward_rows_per_s": keys.numel() / fwd,
                            "backward_rows_per_s": keys.numel() / bwd})
    print(json.dumps({"torch": torch.__version__, "peer": f"fbgemm_gpu-{fbgemm_gpu.__version__}",
                      "optimizer": opt["optimizer"].name, "results": results}))


if __name__ == "__main__":
    main()
