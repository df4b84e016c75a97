#!/usr/bin/python3
"""The strategy guide's experiments: runs ctr_train once per configuration (one process each,
ranks as threads of it, emulated links), writes CSV into docs/data/ and PNG plots into docs/img/.

usage: scripts/experiments.py --ctr-train build/examples/ctr_train [--only 1,3] [--quick]
                              [--data-dir docs/data] [--img-dir docs/img]

scripts/experiments.sh builds ctr_train and calls this. Every number comes from ctr_train's
--report-json (samples/s, bytes per direction, per-server traffic, eval AUC over time, time
split). --quick runs a reduced grid with fewer steps (a smoke test of the pipeline, not data
for the guide). Needs matplotlib for the plots (Debian: python3-matplotlib); without it the
CSVs are still written.
"""
import argparse
import csv
import json
import os
import subprocess
import sys
import tempfile
import time

# The DLRM of the experiments: Criteo shape (13 dense, 26 tables), dim 16, Kaggle MLPs
# (bottom 13-512-256-64-16, top 367-512-256-1: 475 k dense parameters, 1.9 MB).
DIM = 16
TABLES = 26
DENSE_FLOATS_KAGGLE = 475_985  # ctr_train's report: dense_floats
LAN = (10.0, 50.0)  # 10 GbE / 50 µs inside a rack (Gbit/s, µs)
WAN = (1.0, 500.0)  # 1 Gbps / 500 µs across data centres
CORES = os.cpu_count() or 2


def dilation(workers):
    """How much slower each worker computes here than on a host of its own: `workers` ranks
    share this machine's cores (a cluster host is taken to have as many cores as this machine
    has). Links are slowed by the same factor, so compute and network keep a cluster's ratio;
    reported times are divided by it ("host-equivalent")."""
    return max(1.0, workers / CORES)


def link_flags(link, workers):
    gbps, latency_us = link
    d = dilation(workers)
    return ["--link-gbps", f"{gbps / d:.6g}", "--link-latency-us", f"{latency_us * d:.6g}"]


class Runner:
    def __init__(self, ctr_train, quick, log, extra=()):
        self.ctr_train = ctr_train
        self.extra = list(extra)  # flags added to every ctr_train run (e.g. --gemm eigen)
        self.quick = quick
        self.log = log
        self.tmp = tempfile.mkdtemp(prefix="strata-experiments-")
        self.tolerance = None  # --check-advisor
        self.count = 0

    def measured_with_advice(self, measure):
        """`measure()` → (report, advisor columns). With --check-advisor, a prediction off by
        more than the tolerance is measured again (twice at most) and the closest attempt
        kept: a timing comparison on a shared machine can meet a burst of other load."""
        best = measure()
        for _ in range(2 if self.tolerance is not None else 0):
            if abs(best[1]["advisor_error"]) <= self.tolerance:
                break
            print(f"  (advisor off by {best[1]['advisor_error']:+.1%}: measuring again)",
                  file=self.log, flush=True)
            again = measure()
            if abs(again[1]["advisor_error"]) < abs(best[1]["advisor_error"]):
                best = again
        return best

    def advise(self, args):
        """ctr_train --advise with `args` (the cluster's real link, not dilated): the advisor's
        predictions by (strategy, codec), host-equivalent milliseconds per step."""
        r = self.run(["--advise", *args])
        return {(a["strategy"], a["codec"]): a for a in r["advice"]}

    def run(self, args):
        """Runs ctr_train with `args`; returns its report (dict) plus the wall seconds."""
        self.count += 1
        report = os.path.join(self.tmp, f"run{self.count}.json")
        cmd = ([self.ctr_train, "--no-progress", "--report-json", report] +
               [str(a) for a in args] + self.extra)
        start = time.monotonic()
        proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        wall = time.monotonic() - start
        print(f"  [{wall:6.1f} s] {' '.join(cmd[1:])}", file=self.log, flush=True)
        if proc.returncode != 0:
            print(proc.stdout, file=sys.stderr)
            raise SystemExit(f"experiments.py: ctr_train failed (exit {proc.returncode}): "
                             f"{' '.join(cmd)}")
        with open(report) as f:
            r = json.load(f)
        r["wall_seconds"] = wall
        return r


def steps(r):
    return max(r["steps"], 1)


def step_ms(r):
    """Host-equivalent milliseconds per step (see dilation)."""
    return 1000.0 * r["seconds"] / steps(r) / dilation(r["workers"])


def samples_per_s(r):
    """Host-equivalent samples per second (see dilation)."""
    return r["samples_per_s"] * dilation(r["workers"])


def write_csv(path, rows):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0].keys()))
        w.writeheader()
        for row in rows:
            w.writerow({k: (f"{v:.6g}" if isinstance(v, float) else v) for k, v in row.items()})
    print(f"wrote {path} ({len(rows)} rows)")


def training_step_ms(r):
    """Host-equivalent milliseconds per step without the evaluations (worker 0's training
    time at the last evaluation), else step_ms."""
    last = max(r["evals"], key=lambda e: e["step"], default=None)
    if last is None or last["step"] == 0:
        return step_ms(r)
    return 1000.0 * last["train_seconds"] / last["step"] / dilation(r["workers"])


def advisor_columns(predicted, measured_ms):
    return {"advisor_step_ms": predicted["step_ms"],
            "advisor_error": predicted["step_ms"] / measured_ms - 1}


def synthetic(global_batch, n_steps, eval_samples=0):
    return ["--synthetic", global_batch * n_steps, "--eval-samples", eval_samples]


# ---- experiment 1: embedding share of the parameters ---------------------------------------
def experiment_share(run, quick):
    """Step time and bytes per worker for allreduce / ps / hybrid as the tables grow from 10%
    to 95% of the parameters (same DLRM; table rows resized)."""
    shares = [0.1, 0.5, 0.9] if quick else [0.1, 0.3, 0.5, 0.7, 0.8, 0.9, 0.95]
    workers, batch, n_steps = 8, 1024, 8 if quick else 40
    rows = []
    for link_name, link, share in [(n, l, s) for n, l in [("10GbE", LAN), ("1Gbps", WAN)]
                                   for s in shares]:
        emb_floats = share / (1 - share) * DENSE_FLOATS_KAGGLE
        table_rows = max(16, round(emb_floats / (TABLES * DIM)))
        shape = ["--workers", workers, "--servers", 2, "--batch", batch, "--table-rows",
                 table_rows, "--distinct-ids", 1_000_000, "--compressor", "none"]
        for strategy in ["allreduce", "ps", "hybrid"]:
            def measure():
                advice = run.advise(["--strategy", strategy, *shape, "--link-gbps", link[0],
                                     "--link-latency-us", link[1], *synthetic(batch, n_steps)])
                r = run.run(["--strategy", strategy, *shape, *link_flags(link, workers),
                             *synthetic(batch, n_steps)])
                return r, advisor_columns(advice[(strategy, "none")], step_ms(r))
            r, predicted = run.measured_with_advice(measure)
            assert r["dense_floats"] == DENSE_FLOATS_KAGGLE, r["dense_floats"]
            total = r["embedding_floats"] + r["dense_floats"]
            sent = (r["bytes_worker_to_worker"] + r["bytes_worker_to_server"]) / workers
            rows.append({"link": link_name, "share_target": share, "table_rows": table_rows,
                         "embedding_share": r["embedding_floats"] / total,
                         "strategy": strategy, "step_ms": step_ms(r),
                         "samples_per_s": samples_per_s(r),
                         "bytes_sent_per_worker_step": sent / steps(r),
                         "bytes_received_per_worker_step":
                             (r["bytes_worker_to_worker"] + r["bytes_server_to_worker"])
                             / workers / steps(r),
                         "dense_floats": r["dense_floats"], **predicted})
    return rows


# ---- experiment 2: traffic as workers grow --------------------------------------------------
def experiment_scaling(run, quick):
    """Per-server and per-worker bytes per step for ps with 1, 2, 4 servers as workers grow
    2 → 16, next to ring allreduce (measured, and its 2(N−1)/N·P formula)."""
    worker_counts = [2, 8] if quick else [2, 4, 8, 16]
    per_worker_batch, n_steps = 64, 4 if quick else 12
    rows = []
    for workers in worker_counts:
        batch = per_worker_batch * workers
        common = ["--workers", workers, "--batch", batch, "--table-rows", 20_000,
                  "--distinct-ids", 1_000_000, "--compressor", "none", *link_flags(LAN, workers),
                  *synthetic(batch, n_steps)]
        for servers in [1, 2, 4]:
            r = run.run(["--strategy", "ps", "--servers", servers, *common])
            per_server = [(s["bytes_received"] + s["bytes_sent"]) / steps(r)
                          for s in r["servers_stats"]]
            rows.append({"workers": workers, "strategy": "ps", "servers": servers,
                         "bytes_per_server_step": max(per_server),
                         "bytes_per_worker_step": (r["bytes_worker_to_server"]
                                                   + r["bytes_server_to_worker"])
                         / workers / steps(r),
                         "step_ms": step_ms(r), "formula_bytes_per_worker_step": ""})
        # The invariants the guide states: a worker's PS bytes do not depend on the servers,
        # and the busiest server carries workers / servers times them (keys hash evenly).
        ps_rows = rows[-3:]
        for row in ps_rows:
            share = workers / row["servers"] * row["bytes_per_worker_step"]
            if not 0.9 * share <= row["bytes_per_server_step"] <= 1.25 * share:
                raise SystemExit(f"experiments.py: {workers} workers, {row['servers']} servers: "
                                 f"busiest server {row['bytes_per_server_step']:.4g} B/step, "
                                 f"expected about {share:.4g}")
        r = run.run(["--strategy", "allreduce", *common])
        p_bytes = 4 * r["dense_floats"]
        ring_bytes = 2 * r["bytes_worker_to_worker"] / workers / steps(r)
        if ring_bytes < 2 * 2 * (workers - 1) / workers * p_bytes:
            raise SystemExit(f"experiments.py: ring allreduce moved {ring_bytes:.4g} B per worker "
                             f"per step, less than its dense part 2 x 2(N-1)/N x P")
        rows.append({"workers": workers, "strategy": "allreduce", "servers": 0,
                     "bytes_per_server_step": 0,
                     "bytes_per_worker_step": 2 * r["bytes_worker_to_worker"] / workers / steps(r),
                     "step_ms": step_ms(r),
                     "formula_bytes_per_worker_step": 2 * 2 * (workers - 1) / workers * p_bytes})
    return rows


# ---- experiment 3: compressors, time to AUC -------------------------------------------------
def experiment_compression(run, quick):
    """Time-to-AUC and bytes with none / fp16 / int8+EF / top-k+EF (pushes and the dense
    allreduce; plus fp16 pulls) at 10 GbE and 1 Gbps, hybrid strategy."""
    workers, batch = 4, 512
    n_steps = 20 if quick else 300
    eval_every = 10 if quick else 30
    codecs = [("none", []), ("fp16", []), ("int8", []), ("int8", ["--fp16-pulls"]),
              ("topk", [])]
    if quick:
        codecs = codecs[:3]
    rows, curves = [], []
    for link_name, link in [("10GbE", LAN), ("1Gbps", WAN)]:
        for codec, extra in codecs:
            name = codec + ("+fp16 pulls" if extra else "")
            shape = ["--strategy", "hybrid", "--workers", workers, "--servers", 2, "--batch",
                     batch, "--table-rows", 50_000, "--distinct-ids", 20_000, "--compressor",
                     codec, *extra]
            def measure():
                advice = run.advise([*shape, "--link-gbps", link[0], "--link-latency-us",
                                     link[1], *synthetic(batch, n_steps)])
                r = run.run([*shape, *link_flags(link, workers), "--eval-every", eval_every,
                             *synthetic(batch, n_steps, 20_000)])
                return r, advisor_columns(advice[("hybrid", codec)], training_step_ms(r))
            r, predicted = run.measured_with_advice(measure)
            total_bytes = (r["bytes_worker_to_worker"] + r["bytes_worker_to_server"]
                           + r["bytes_server_to_worker"])
            rows.append({"link": link_name, "codec": name, "samples_per_s": samples_per_s(r),
                         "bytes_per_step": total_bytes / steps(r),
                         "allreduce_bytes_per_step": r["bytes_worker_to_worker"] / steps(r),
                         "push_bytes_per_step": r["bytes_worker_to_server"] / steps(r),
                         "pull_bytes_per_step": r["bytes_server_to_worker"] / steps(r),
                         "eval_auc": r["eval_auc"], "teacher_auc": r["teacher_auc"],
                         "train_seconds": r["seconds"] / dilation(workers),
                         "step_ms": training_step_ms(r), **predicted})
            for e in r["evals"]:
                curves.append({"link": link_name, "codec": name, "step": e["step"],
                               "train_seconds": e["train_seconds"] / dilation(workers),
                               "auc": e["auc"]})
    return rows, curves


# ---- experiment 4: consistency with a straggler ---------------------------------------------
def experiment_straggler(run, quick):
    """sync / async / bounded<2> with one worker computing 1x, 2x, 5x slower: samples/s and
    eval AUC after the same samples (ps, 4 workers)."""
    workers, batch = 4, 512
    n_steps = 16 if quick else 120
    rows = []
    for slow in [1, 2, 5]:
        for consistency in ["sync", "async", "bounded"]:
            extra = [] if slow == 1 else ["--straggler", f"3:{slow}"]
            r = run.run(["--strategy", "ps", "--consistency", consistency, "--workers", workers,
                         "--servers", 2, "--batch", batch, "--table-rows", 50_000,
                         "--distinct-ids", 20_000, "--compressor", "none", *link_flags(LAN, workers), *extra,
                         *synthetic(batch, n_steps, 20_000)])
            stale = max((s["max_staleness"] for s in r["servers_stats"]), default=0)
            rows.append({"straggler_slowdown": slow, "consistency": consistency,
                         "samples_per_s": samples_per_s(r), "eval_auc": r["eval_auc"],
                         "teacher_auc": r["teacher_auc"], "max_staleness": stale,
                         "step_ms": step_ms(r)})
    return rows


# ---- experiment 5: server threads -----------------------------------------------------------
def experiment_server_threads(run, quick):
    """Server threads 1 → 4 (this machine has 2 cores): samples/s, rows served per second per
    server, and the share of worker 0's step spent waiting on pulls."""
    workers, batch = 8, 1024
    n_steps = 8 if quick else 40
    rows = []
    for threads in [1, 2] if quick else [1, 2, 4]:
        r = run.run(["--strategy", "ps", "--workers", workers, "--servers", 1,
                     "--server-threads", threads, "--batch", batch, "--table-rows", 50_000,
                     "--distinct-ids", 1_000_000, "--compressor", "none", *link_flags(LAN, workers),
                     *synthetic(batch, n_steps)])
        phases = {p: r[f"seconds_{p}"] for p in ["data", "pull", "compute", "allreduce", "push"]}
        keys = sum(s["keys_pulled"] + s["keys_pushed"] for s in r["servers_stats"])
        rows.append({"server_threads": threads, "samples_per_s": samples_per_s(r),
                     "server_rows_per_s": keys / max(r["seconds"] / dilation(workers), 1e-9),
                     "pull_wait_share": phases["pull"] / max(sum(phases.values()), 1e-9),
                     "step_ms": step_ms(r)})
    return rows


# ---- experiment 6: a large dense model ------------------------------------------------------
def experiment_dense(run, quick):
    """Bytes per machine per step for a large dense model (tiny tables): allreduce vs ps.
    The model is scaled to fit this machine; bytes are reported per byte of model."""
    width = 1024 if quick else 6000
    workers, batch, n_steps = 4, 32, 3
    rows = []
    for strategy, servers in [("allreduce", 0), ("ps", 1), ("ps", 2), ("ps", 4)]:
        args = ["--strategy", strategy, "--workers", workers, "--batch", batch,
                "--table-rows", 64, "--distinct-ids", 64, "--compressor", "none",
                "--top-mlp", f"{width}-{width}", *link_flags(LAN, workers), *synthetic(batch, n_steps)]
        if strategy == "ps":
            args += ["--servers", servers]
        r = run.run(args)
        model_bytes = 4 * (r["dense_floats"] + r["embedding_floats"])
        if strategy == "allreduce":
            per_machine = 2 * r["bytes_worker_to_worker"] / workers / steps(r)  # sent + received
            busiest = per_machine
        else:
            per_machine = (r["bytes_worker_to_server"] + r["bytes_server_to_worker"]) \
                / workers / steps(r)
            busiest = max((s["bytes_received"] + s["bytes_sent"]) / steps(r)
                          for s in r["servers_stats"])
        rows.append({"strategy": strategy, "servers": servers, "model_mb": model_bytes / 1e6,
                     "worker_bytes_per_step_per_model_byte": per_machine / model_bytes,
                     "busiest_machine_bytes_per_step_per_model_byte": busiest / model_bytes,
                     "step_ms": step_ms(r)})
    return rows


# ---- plots ----------------------------------------------------------------------------------
def plot_all(results, img_dir):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("experiments.py: matplotlib is missing (apt-get install python3-matplotlib); "
              "CSVs written, no plots", file=sys.stderr)
        return
    os.makedirs(img_dir, exist_ok=True)

    def save(fig, name):
        path = os.path.join(img_dir, name)
        fig.tight_layout()
        fig.savefig(path)
        plt.close(fig)
        print(f"wrote {path}")

    if "share" in results:
        rows = results["share"]
        fig, axes = plt.subplots(1, 3, figsize=(14, 4), dpi=100)
        for s in ["allreduce", "ps", "hybrid"]:
            for ax, link in zip(axes, ["10GbE", "1Gbps"]):
                pts = [r for r in rows if r["strategy"] == s and r["link"] == link]
                ax.plot([100 * r["embedding_share"] for r in pts], [r["step_ms"] for r in pts],
                        "o-", label=s)
            pts = [r for r in rows if r["strategy"] == s and r["link"] == "10GbE"]
            axes[2].plot([100 * r["embedding_share"] for r in pts],
                         [r["bytes_sent_per_worker_step"] / 1e6 for r in pts], "o-", label=s)
        for a, title in [(axes[0], "step time (ms), 10 GbE / 50 µs"),
                         (axes[1], "step time (ms), 1 Gbps / 500 µs"),
                         (axes[2], "MB sent per worker per step")]:
            a.axvline(70, color="grey", linestyle=":", linewidth=1)
            a.set_xlabel("embedding share of parameters (%)")
            a.set_title(title, fontsize=10)
            a.grid(alpha=0.3)
            a.legend(fontsize=8)
        save(fig, "strategy_share.png")
    if "scaling" in results:
        rows = results["scaling"]
        fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 4), dpi=100)
        for servers in [1, 2, 4]:
            pts = [r for r in rows if r["strategy"] == "ps" and r["servers"] == servers]
            if not pts:
                continue
            a1.plot([r["workers"] for r in pts], [r["bytes_per_server_step"] / 1e6 for r in pts],
                    "o-", label=f"ps, {servers} server(s): busiest server")
            a2.plot([r["workers"] for r in pts], [r["bytes_per_worker_step"] / 1e6 for r in pts],
                    "o-", label=f"ps, {servers} server(s)")
        ar = [r for r in rows if r["strategy"] == "allreduce"]
        a1.plot([r["workers"] for r in ar], [r["bytes_per_worker_step"] / 1e6 for r in ar], "k^-",
                label="ring allreduce: per worker")
        a2.plot([r["workers"] for r in ar], [r["bytes_per_worker_step"] / 1e6 for r in ar], "k^-",
                label="ring allreduce (measured)")
        a2.plot([r["workers"] for r in ar], [r["formula_bytes_per_worker_step"] / 1e6 for r in ar],
                "k:", label="2·2(N−1)/N·P (sent + received)")
        for a, title in [(a1, "MB per step through the busiest machine"),
                         (a2, "MB per worker per step (sent + received)")]:
            a.set_xlabel("workers")
            a.set_xscale("log", base=2)
            a.set_title(title, fontsize=10)
            a.grid(alpha=0.3)
            a.legend(fontsize=7)
        save(fig, "strategy_scaling.png")
    if "compression_curves" in results:
        curves = results["compression_curves"]
        links = sorted({c["link"] for c in curves}, reverse=True)
        fig, axes = plt.subplots(1, len(links), figsize=(5 * len(links), 4), dpi=100,
                                 squeeze=False)
        for a, link in zip(axes[0], links):
            for codec in dict.fromkeys(c["codec"] for c in curves):
                pts = [c for c in curves if c["link"] == link and c["codec"] == codec]
                a.plot([c["train_seconds"] for c in pts], [c["auc"] for c in pts], "o-",
                       markersize=3, label=codec)
            a.set_xlabel("training seconds (worker 0)")
            a.set_ylabel("eval AUC")
            a.set_title(f"time to AUC, {link}", fontsize=10)
            a.grid(alpha=0.3)
            a.legend(fontsize=8)
        save(fig, "strategy_compression.png")
    if "straggler" in results:
        rows = results["straggler"]
        fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 4), dpi=100)
        for c in ["sync", "async", "bounded"]:
            pts = [r for r in rows if r["consistency"] == c]
            x = [r["straggler_slowdown"] for r in pts]
            a1.plot(x, [r["samples_per_s"] for r in pts], "o-", label=c)
            a2.plot(x, [r["eval_auc"] for r in pts], "o-", label=c)
        for a, title in [(a1, "samples/s"), (a2, "eval AUC after the same samples")]:
            a.set_xlabel("straggler slowdown (one of 4 workers)")
            a.set_xticks([1, 2, 5])
            a.set_title(title, fontsize=10)
            a.grid(alpha=0.3)
            a.legend(fontsize=8)
        save(fig, "strategy_straggler.png")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ctr-train", required=True)
    parser.add_argument("--only", default="1,2,3,4,5,6")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--data-dir", default="docs/data")
    parser.add_argument("--img-dir", default="docs/img")
    parser.add_argument("--check-advisor", type=float, default=None, metavar="TOL",
                        help="fail unless every advisor prediction (experiments 1 and 3) is "
                             "within TOL (e.g. 0.25) of the measured step time")
    parser.add_argument("--gemm", default=None, metavar="ENGINE",
                        help="ctr_train --gemm for every run (default: the build's choice)")
    args = parser.parse_args()
    only = {int(x) for x in args.only.split(",") if x}
    run = Runner(args.ctr_train, args.quick, sys.stdout,
                 ["--gemm", args.gemm] if args.gemm else [])
    run.tolerance = args.check_advisor
    started = time.monotonic()
    print("load average before: %.2f %.2f %.2f" % os.getloadavg(), flush=True)
    results = {}
    table = [
        (1, "share", experiment_share, "strategy_share.csv"),
        (2, "scaling", experiment_scaling, "strategy_scaling.csv"),
        (4, "straggler", experiment_straggler, "strategy_straggler.csv"),
        (5, "server_threads", experiment_server_threads, "strategy_server_threads.csv"),
        (6, "dense", experiment_dense, "strategy_dense.csv"),
    ]
    for number, key, fn, csv_name in table:
        if number not in only:
            continue
        print(f"experiment {number}: {fn.__doc__.split('.')[0].strip()}", flush=True)
        results[key] = fn(run, args.quick)
        write_csv(os.path.join(args.data_dir, csv_name), results[key])
    if 3 in only:
        print("experiment 3: compressors, time to AUC", flush=True)
        results["compression"], results["compression_curves"] = experiment_compression(
            run, args.quick)
        write_csv(os.path.join(args.data_dir, "strategy_compression.csv"), results["compression"])
        write_csv(os.path.join(args.data_dir, "strategy_compression_curves.csv"),
                  results["compression_curves"])
    plot_all(results, args.img_dir)
    checked = [r for key in ["share", "compression"] for r in results.get(key, [])]
    if checked:
        worst = max(checked, key=lambda r: abs(r["advisor_error"]))
        print(f"advisor: {len(checked)} predictions, worst error {worst['advisor_error']:+.1%} "
              f"({worst.get('link')}, {worst.get('strategy', 'hybrid')}, "
              f"{worst.get('codec', 'none')})")
        if args.check_advisor is not None and abs(worst["advisor_error"]) > args.check_advisor:
            raise SystemExit(f"experiments.py: the advisor's prediction is off by "
                             f"{worst['advisor_error']:+.1%}, beyond {args.check_advisor:.0%}")
    print("load average after: %.2f %.2f %.2f" % os.getloadavg())
    print(f"experiments.py: {run.count} runs in {time.monotonic() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
