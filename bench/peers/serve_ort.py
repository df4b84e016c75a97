"""onnxruntime peer of bench_serve: the exported strata model (serve::export_onnx) timed as a
serving runtime runs it, on the inputs bench_serve wrote.

Usage: serve_ort.py --model M.onnx --dense D.f32 --sparse S.i64 --expected E.f32
                    [--batches 1,64,512] [--seconds 1.0] [--throughput-batch 512]

dense: float32 [N, 13], sparse: int64 [N, 26], expected: the predictor's probabilities float32
[N] (little-endian, row-major). Verifies first (every probability within 1e-5 of the
predictor's), then prints one JSON object per line on stdout:
  {"peer": "onnxruntime", "version": V, "max_abs_diff": D}
  {"batch": B, "intra_threads": T, "p50_us": ..., "p99_us": ..., "calls": n}
                                   latency of one caller, for T = 1 and 2 intra-op threads
  {"throughput_batch": B, "threads": 2, "samples_per_s": S}  2 callers, 1 intra-op thread each
Latencies are wall times of InferenceSession.run (the Python call included, a few microseconds),
inputs prepared beforehand. Exit 3 when onnxruntime cannot be imported, 1 when the check fails.
"""
import argparse
import json
import sys
import threading
import time

try:
    import numpy as np
    import onnxruntime as ort
except ImportError as e:  # bench_serve skips the comparison
    print(json.dumps({"peer": "onnxruntime", "error": f"not importable: {e}"}))
    sys.exit(3)


def session(model, intra_threads):
    options = ort.SessionOptions()
    options.intra_op_num_threads = intra_threads
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    return ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])


def percentile(sorted_values, q):
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--dense", required=True)
    ap.add_argument("--sparse", required=True)
    ap.add_argument("--expected", required=True)
    ap.add_argument("--batches", default="1,64,512")
    ap.add_argument("--seconds", type=float, default=1.0)
    ap.add_argument("--throughput-batch", type=int, default=512)
    a = ap.parse_args()

    expected = np.fromfile(a.expected, dtype="<f4")
    n = expected.size
    dense = np.fromfile(a.dense, dtype="<f4").reshape(n, -1)
    sparse = np.fromfile(a.sparse, dtype="<i8").reshape(n, -1)

    check = session(a.model, 2)
    (got,) = check.run(["probability"], {"dense": dense, "sparse": sparse})
    diff = float(np.max(np.abs(got[:, 0].astype(np.float64) - expected)))
    print(json.dumps({"peer": "onnxruntime", "version": ort.__version__, "max_abs_diff": diff}),
          flush=True)
    if not diff <= 1e-5:
        print(f"serve_ort.py: onnxruntime differs from the predictor by {diff}", file=sys.stderr)
        return 1

    for intra_threads in (1, 2):
        latency = session(a.model, intra_threads)
        for b in (int(x) for x in a.batches.split(",")):
            feed = {"dense": np.ascontiguousarray(dense[:b]),
                    "sparse": np.ascontiguousarray(sparse[:b])}
            for _ in range(20):  # warm-up
                latency.run(["probability"], feed)
            times = []
            start = time.perf_counter()
            while time.perf_counter() - start < a.seconds or len(times) < 50:
                t0 = time.perf_counter_ns()
                latency.run(["probability"], feed)
                times.append((time.perf_counter_ns() - t0) / 1e3)
            times.sort()
            print(json.dumps({"batch": b, "intra_threads": intra_threads,
                              "p50_us": percentile(times, 0.50), "p99_us": percentile(times, 0.99),
                              "calls": len(times)}), flush=True)

    shared = session(a.model, 1)
    b = a.throughput_batch
    feed = {"dense": np.ascontiguousarray(dense[:b]), "sparse": np.ascontiguousarray(sparse[:b])}
    for _ in range(5):
        shared.run(["probability"], feed)
    counts = [0, 0]
    stop = threading.Event()

    def caller(i):
        while not stop.is_set():
            shared.run(["probability"], feed)  # releases the GIL while it computes
            counts[i] += 1

    threads = [threading.Thread(target=caller, args=(i,)) for i in range(2)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    time.sleep(a.seconds * 2)
    stop.set()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - start
    print(json.dumps({"throughput_batch": b, "threads": 2,
                      "samples_per_s": sum(counts) * b / elapsed}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
