#!/usr/bin/python3
"""PyTorch peer of bench_embedding: nn.EmbeddingBag(mode='sum', sparse=True) + torch.optim.SGD.

Reads the bench's cases (keys and CSR offsets as little-endian uint64 files), times
  forward : bag(keys, offsets)                                  (pooled lookup)
  backward: out.backward(d_out) + SGD step on the sparse grad   (sparse update)
with torch.set_num_threads(t) for each t in --threads, and prints one JSON object on stdout:
  {"torch": version, "results": [{"case", "threads", "forward_rows_per_s",
                                  "backward_rows_per_s"}]}
rows/s = keys per second (one gathered / updated row per key), best of --repeats runs.
"""
import argparse
import json
import sys
import time

import numpy as np
import torch


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
    parser.add_argument("--case", action="append", default=[],
                        help="name:keys_file:offsets_file (repeatable)")
    args = parser.parse_args()

    torch.manual_seed(0)
    bag = torch.nn.EmbeddingBag(args.rows, args.dim, mode="sum", sparse=True,
                                include_last_offset=True)
    opt = torch.optim.SGD(bag.parameters(), lr=1e-3)
    results = []
    for spec in args.case:
        name, keys_file, offsets_file = spec.split(":")
        keys = torch.from_numpy(np.fromfile(keys_file, dtype=np.uint64).astype(np.int64))
        offsets = torch.from_numpy(np.fromfile(offsets_file, dtype=np.uint64).astype(np.int64))
        bags = offsets.numel() - 1
        d_out = torch.full((bags, args.dim), 1e-3)
        with torch.no_grad():
            check = bag(keys, offsets)
        if tuple(check.shape) != (bags, args.dim):
            sys.exit(f"embeddingbag_torch: output shape {tuple(check.shape)} != {(bags, args.dim)}")
        for threads in [int(t) for t in args.threads.split(",")]:
            torch.set_num_threads(threads)

            def forward():
                with torch.no_grad():
                    bag(keys, offsets)

            out = bag(keys, offsets)

            def backward():
                out.backward(d_out, retain_graph=True)
                opt.step()
                opt.zero_grad(set_to_none=True)

            fwd = best_seconds(forward, args.repeats)
            bwd = best_seconds(backward, args.repeats)
            results.append({"case": name, "threads": threads,
                            "forward_rows_per_s": keys.numel() / fwd,
                            "backward_rows_per_s": keys.numel() / bwd})
    print(json.dumps({"torch": torch.__version__, "results": results}))


if __name__ == "__main__":
    main()
