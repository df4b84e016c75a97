#!/usr/bin/python3
"""PyTorch peer of bench_dlrm: one DLRM training step on the dense part (Criteo Kaggle sizes),
embedding rows given as random inputs (their gradients computed too), SGD update.

With --device cuda (bench_gpu_worker) the model runs on the GPU while the embedding rows stay on
the host, as a GPU worker fed by CPU tables or parameter servers sees them: every step copies the
rows up (from pinned memory) and their gradients down, like strata's cuda::dlrm.

Prints one JSON object per (batch, threads) on stdout:
  {"peer": "pytorch", "version": ..., "batch": B, "threads": T, "samples_per_s": S}
"""
import argparse
import json
import sys
import time

try:
    import torch
except ImportError as e:  # the caller skips the comparison
    print(json.dumps({"peer": "pytorch", "error": f"torch not importable: {e}"}))
    sys.exit(3)


def mlp(sizes, relu_last):
    layers = []
    for i in range(len(sizes) - 1):
        layers.append(torch.nn.Linear(sizes[i], sizes[i + 1]))
        if i + 2 < len(sizes) or relu_last:
            layers.append(torch.nn.ReLU())
    return torch.nn.Sequential(*layers)


class DLRM(torch.nn.Module):
    def __init__(self, dense=13, features=26, dim=16):
        super().__init__()
        self.n = features + 1
        self.bottom = mlp([dense, 512, 256, 64, dim], True)
        self.top = mlp([dim + self.n * (self.n - 1) // 2, 512, 256, 1], False)
        li, lj = torch.tril_indices(self.n, self.n, offset=-1)
        self.register_buffer("li", li)
        self.register_buffer("lj", lj)

    def forward(self, dense, emb):
        z = self.bottom(dense)
        t = torch.stack([z] + emb, dim=1)  # B x n x d
        dots = torch.bmm(t, t.transpose(1, 2))
        x = torch.cat([z, dots[:, self.li, self.lj]], dim=1)
        return self.top(x).squeeze(1)


def run(batch, threads, steps, repeats, device="cpu"):
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    model = DLRM().to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loss_fn = torch.nn.BCEWithLogitsLoss()
    on_gpu = device != "cpu"
    if on_gpu:
        torch.backends.cuda.matmul.allow_tf32 = False  # full fp32, as strata's cuBLAS calls
        torch.backends.cudnn.allow_tf32 = False
    dense_host = torch.rand(batch, 13)
    emb_host = [(torch.rand(batch, 16) - 0.5) for _ in range(26)]
    if on_gpu:
        dense_host = dense_host.pin_memory()
        emb_host = [e.pin_memory() for e in emb_host]
    labels = (torch.rand(batch) < 0.5).float().to(device)
    grads_host = [torch.empty(batch, 16).pin_memory() if on_gpu else None for _ in range(26)]

    def step():
        opt.zero_grad(set_to_none=True)
        if on_gpu:  # rows come from host memory, gradients go back to it
            dense = dense_host.to(device, non_blocking=True)
            emb = [e.to(device, non_blocking=True).requires_grad_() for e in emb_host]
        else:
            dense = dense_host
            emb = [e.requires_grad_() for e in emb_host]
            for e in emb:
                e.grad = None
        loss = loss_fn(model(dense, emb), labels)
        loss.backward()
        opt.step()
        if on_gpu:
            for g, e in zip(grads_host, emb):
                g.copy_(e.grad, non_blocking=True)
            torch.cuda.synchronize()
        return loss

    for _ in range(max(1, 512 // batch)):  # warm-up
        step()
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(steps):
            step()
        best = min(best, time.perf_counter() - t0)
    return batch * steps / best


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--batch", default="128,2048")
    p.add_argument("--threads", default="1,2")
    p.add_argument("--samples", type=int, default=8192, help="samples per timed repeat")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--device", default="cpu", help="cpu or cuda")
    a = p.parse_args()
    if a.device != "cpu" and not torch.cuda.is_available():
        print(json.dumps({"peer": "pytorch", "error": "torch has no usable CUDA device"}))
        sys.exit(3)
    for b in (int(x) for x in a.batch.split(",")):
        for t in (int(x) for x in a.threads.split(",")):
            steps = max(2, a.samples // b)
            sps = run(b, t, steps, a.repeats, a.device)
            print(json.dumps({"peer": "pytorch", "version": torch.__version__, "batch": b,
                              "threads": t, "device": a.device, "samples_per_s": sps}),
                  flush=True)


if __name__ == "__main__":
    main()
