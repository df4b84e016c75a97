"""ONNX parity: the exported models run in onnxruntime against serve::predictor.

Usage: onnx_parity.py CASES   (written by serve_onnx_parity_data; see tests/serve/onnx_parity.sh)

Each line of CASES names a bundle, its exported model.onnx, a batch size and three files: the
inputs (dense float32 [B, 13], sparse int64 [B, 26]) and the predictor's probabilities
(float32 [B]). For every case the model runs on onnxruntime's CPU provider and every probability
must be within 1e-5 of the predictor's. Per model, an empty batch gives [0, 1], and keys the predictor refuses (a key = the
table's rows, a negative key) must make onnxruntime refuse the call too (an out-of-bounds
Gather index). Prints the largest
difference per case; exits 0 when every check holds, 1 otherwise.
"""
import sys

import numpy as np
import onnxruntime as ort

TOLERANCE = 1e-5


def session(path):
    return ort.InferenceSession(path, providers=["CPUExecutionProvider"])


def quiet():
    """Run options that keep onnxruntime's log quiet for a call expected to fail."""
    options = ort.RunOptions()
    options.log_severity_level = 4  # fatal only; the exception still carries the message
    return options


def main(cases_path):
    failures = []
    refused_checked = set()
    with open(cases_path) as f:
        cases = [line.split() for line in f if line.strip()]
    if not cases:
        print(f"no cases in {cases_path}")
        return 1
    for name, model, batch, dense_path, sparse_path, expected_path, rows in cases:
        batch, rows = int(batch), int(rows)
        dense = np.fromfile(dense_path, dtype="<f4").reshape(batch, -1)
        sparse = np.fromfile(sparse_path, dtype="<i8").reshape(batch, -1)
        expected = np.fromfile(expected_path, dtype="<f4")
        s = session(model)
        inputs = {i.name: i for i in s.get_inputs()}
        assert set(inputs) == {"dense", "sparse"}, inputs
        assert [o.name for o in s.get_outputs()] == ["probability"]
        (got,) = s.run(["probability"], {"dense": dense, "sparse": sparse})
        ok_shape = got.shape == (batch, 1) and got.dtype == np.float32
        diff = float(np.max(np.abs(got[:, 0].astype(np.float64) - expected))) if ok_shape else float("inf")
        status = "ok" if ok_shape and diff <= TOLERANCE else "FAIL"
        print(f"{name:16s} batch {batch:4d}: max |onnxruntime - predictor| = {diff:.3e} "
              f"(tolerance {TOLERANCE:.0e}, output {got.shape} {got.dtype}) {status}")
        if status != "ok":
            failures.append(f"{name} batch {batch}")
        if model in refused_checked:
            continue
        refused_checked.add(model)
        (empty,) = s.run(["probability"], {"dense": dense[:0], "sparse": sparse[:0]})
        ok_empty = empty.shape == (0, 1)
        print(f"{name:16s} batch    0: output {empty.shape} {'ok' if ok_empty else 'FAIL'}")
        if not ok_empty:
            failures.append(f"{name} batch 0")
        for bad, what in ((rows, "a key equal to the table's rows"), (-1, "a negative key")):
            keys = sparse.copy()
            keys[0, 0] = bad
            try:
                s.run(["probability"], {"dense": dense, "sparse": keys}, quiet())
            except Exception as e:  # onnxruntime's InvalidArgument, from the table's Gather
                message = str(e)
                why = message[message.find("Status Message:") + 16:].strip()
                bounds = "out of data bounds" in message
                print(f"{name:16s} {what}: refused ({why}) {'ok' if bounds else 'FAIL'}")
                if not bounds:
                    failures.append(f"{name} {what}: refused for another reason")
            else:
                print(f"{name:16s} {what}: ANSWERED, the predictor refuses it FAIL")
                failures.append(f"{name} {what}")
    print(f"onnxruntime {ort.__version__}, numpy {np.__version__}: {len(cases)} cases, "
          f"{len(failures)} failed")
    if failures:
        print("failed: " + ", ".join(failures))
        return 1
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: onnx_parity.py CASES")
    sys.exit(main(sys.argv[1]))
