#!/usr/bin/python3
"""Plot a resnet_train --csv file (epoch,train_loss,test_accuracy) as a PNG.

usage: scripts/plot_resnet.py acc.csv docs/img/resnet_accuracy.png [--title TEXT]

Needs matplotlib (Debian: apt-get install python3-matplotlib); a documentation tool only,
never a dependency of the library, its tests or its examples.
"""
import argparse
import csv
import sys


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("csv_path")
    parser.add_argument("png_path")
    parser.add_argument("--title", default="strata ResNet-20 on Fashion-MNIST")
    parser.add_argument("--target", type=float, default=0.91, help="horizontal goal line")
    args = parser.parse_args()
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("plot_resnet.py: matplotlib is missing; apt-get install python3-matplotlib",
              file=sys.stderr)
        return 1
    epochs, loss, acc = [], [], []
    with open(args.csv_path, newline="") as f:
        for row in csv.DictReader(f):
            epochs.append(int(row["epoch"]))
            loss.append(float(row["train_loss"]))
            acc.append(float(row["test_accuracy"]))
    if not epochs:
        print(f"plot_resnet.py: {args.csv_path} has no rows", file=sys.stderr)
        return 1
    fig, ax_acc = plt.subplots(figsize=(7, 4.2), dpi=110)
    ax_acc.plot(epochs, [100 * a for a in acc], "o-", color="tab:blue", label="test accuracy")
    ax_acc.axhline(100 * args.target, color="tab:blue", linestyle=":", linewidth=1,
                   label=f"goal {100 * args.target:.0f}%")
    for e, a in zip(epochs, acc):
        ax_acc.annotate(f"{100 * a:.1f}", (e, 100 * a), textcoords="offset points",
                        xytext=(0, 6), ha="center", fontsize=7, color="tab:blue")
    ax_acc.set_xlabel("epoch")
    ax_acc.set_ylabel("test accuracy (%)", color="tab:blue")
    ax_acc.set_xticks(epochs)
    ax_acc.grid(alpha=0.3)
    ax_loss = ax_acc.twinx()
    ax_loss.plot(epochs, loss, "s--", color="tab:red", label="train loss (epoch mean)")
    ax_loss.set_ylabel("train loss", color="tab:red")
    lines = ax_acc.get_lines() + ax_loss.get_lines()
    ax_acc.legend(lines, [l.get_label() for l in lines], loc="center right", fontsize=8)
    ax_acc.set_title(args.title, fontsize=10)
    fig.tight_layout()
    fig.savefig(args.png_path)
    print(f"plot_resnet.py: wrote {args.png_path} ({len(epochs)} epochs, "
          f"final accuracy {100 * acc[-1]:.2f}%)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
