#!/usr/bin/python3
"""PyTorch peer of bench_resnet: one training step (forward, softmax cross-entropy, backward,
SGD update) of the CIFAR-style ResNet-(6n+2) on 1 x 28 x 28 inputs, 10 classes, exactly the
architecture of strata::models::resnet: 3x3 conv stem + BN + ReLU, three stages of n basic
blocks (widths 16/32/64, stride 2 at the start of stages 2 and 3, option-A shortcut: strided
subsampling and zero-padded channels), global average pooling, linear classifier.

Prints one JSON object per (batch, threads) on stdout:
  {"peer": "pytorch", "version": ..., "batch": B, "threads": T, "images_per_s": S}
"""
import argparse
import json
import sys
import time

try:
    import torch
    import torch.nn.functional as F
except ImportError as e:  # the caller skips the comparison
    print(json.dumps({"peer": "pytorch", "error": f"torch not importable: {e}"}))
    sys.exit(3)


class Block(torch.nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = torch.nn.BatchNorm2d(cout)
        self.conv2 = torch.nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = torch.nn.BatchNorm2d(cout)
        self.stride, self.pad = stride, cout - cin

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        short = x
        if self.stride != 1 or self.pad != 0:  # option A
            short = F.pad(x[:, :, :: self.stride, :: self.stride], (0, 0, 0, 0, 0, self.pad))
        return F.relu(out + short)


class ResNet(torch.nn.Module):
    def __init__(self, n=3, widths=(16, 32, 64), classes=10):
        super().__init__()
        self.stem = torch.nn.Conv2d(1, widths[0], 3, 1, 1, bias=False)
        self.bn = torch.nn.BatchNorm2d(widths[0])
        blocks, cin = [], widths[0]
        for s, w in enumerate(widths):
            for b in range(n):
                blocks.append(Block(cin, w, 2 if (s > 0 and b == 0) else 1))
                cin = w
        self.blocks = torch.nn.Sequential(*blocks)
        self.fc = torch.nn.Linear(cin, classes)

    def forward(self, x):
        x = F.relu(self.bn(self.stem(x)))
        x = self.blocks(x)
        return self.fc(x.mean(dim=(2, 3)))


def run(batch, threads, steps, repeats, n, channels_last):
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    model = ResNet(n)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    images = torch.randn(batch, 1, 28, 28)
    labels = torch.randint(0, 10, (batch,))
    if channels_last:
        model = model.to(memory_format=torch.channels_last)
        images = images.contiguous(memory_format=torch.channels_last)

    def step():
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(images), labels)
        loss.backward()
        opt.step()
        return loss

    step()  # warm-up
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(steps):
            step()
        best = min(best, time.perf_counter() - t0)
    return batch * steps / best


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--batch", default="128")
    p.add_argument("--threads", default="1,2")
    p.add_argument("--n", type=int, default=3, help="blocks per stage (depth 6n+2)")
    p.add_argument("--steps", type=int, default=3, help="steps per timed repeat")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--channels-last", action="store_true", help="NHWC tensors (oneDNN)")
    a = p.parse_args()
    for b in (int(x) for x in a.batch.split(",")):
        for t in (int(x) for x in a.threads.split(",")):
            ips = run(b, t, a.steps, a.repeats, a.n, a.channels_last)
            print(json.dumps({"peer": "pytorch", "version": torch.__version__, "batch": b,
                              "threads": t, "images_per_s": ips}), flush=True)


if __name__ == "__main__":
    main()
