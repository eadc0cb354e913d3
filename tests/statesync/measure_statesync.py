"""Measure state sync of one large float array: executor and follower, each in its own process.

Run by hand (not collected by pytest)::

    python tests/statesync/measure_statesync.py --mb 100 1024 [--store DIR]

For each size: the executor process builds the array, runs ``diff`` (pickle with out-of-band
buffers), ``encode`` (stream into a LocalDirectoryStore, fsync), then an unchanged ``diff`` (the
cost of re-checking an unchanged array every cell); the follower process runs ``apply`` (fetch,
verify sha256, unpickle). Peak RSS is VmHWM, reset just before the measured step, minus the RSS
before it; the array itself accounts for one array-size of the executor's RSS.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import subprocess
import sys
import tempfile
import time
from typing import Any

MiB = 1024 * 1024


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return -1


def _reset_peak() -> None:
    try:
        with open("/proc/self/clear_refs", "w") as clear:
            clear.write("5")
    except OSError:
        pass


def _measure(step: Any) -> tuple[Any, float, float]:
    """Run `step()`; return (result, seconds, peak extra MiB over the RSS before)."""
    before = _status_kib("VmRSS")
    _reset_peak()
    started = time.perf_counter()
    result = step()
    seconds = time.perf_counter() - started
    return result, seconds, (_status_kib("VmHWM") - before) / 1024


def executor(size_mb: int, root: str) -> dict[str, Any]:
    import pickle

    import numpy as np

    from kernelfleet.kernels.objectstore import LocalDirectoryStore
    from kernelfleet.kernels.replica.statesync import NamespaceTracker, encode

    store = LocalDirectoryStore(root)
    namespace: dict[str, Any] = {"__name__": "__main__"}
    tracker = NamespaceTracker(namespace)
    namespace["x"] = np.random.default_rng(0).random(size_mb * MiB // 8)
    delta, diff_s, diff_mb = _measure(tracker.diff)
    encoded, encode_s, encode_mb = _measure(functools.partial(encode, delta, store))
    tracker.commit(delta, encoded)
    unchanged, recheck_s, recheck_mb = _measure(tracker.diff)
    assert not unchanged, unchanged
    _, naive_s, naive_mb = _measure(lambda: len(pickle.dumps(namespace["x"], protocol=4)))
    return {
        "key": encoded.pointers["x"],
        "diff_s": diff_s,
        "diff_extra_mib": diff_mb,
        "encode_store_s": encode_s,
        "encode_extra_mib": encode_mb,
        "unchanged_recheck_s": recheck_s,
        "unchanged_recheck_extra_mib": recheck_mb,
        "naive_pickle_dumps_s": naive_s,
        "naive_pickle_dumps_extra_mib": naive_mb,
        "entry": encoded.to_dict(),
    }


def follower(entry: dict[str, Any], root: str) -> dict[str, Any]:
    from kernelfleet.kernels.objectstore import LocalDirectoryStore
    from kernelfleet.kernels.replica.statesync import EncodedDelta, apply

    store = LocalDirectoryStore(root)
    namespace: dict[str, Any] = {"__name__": "__main__"}
    encoded = EncodedDelta.from_dict(entry)
    report, apply_s, apply_mb = _measure(lambda: apply(encoded, namespace, store))
    _, noverify_s, _ = _measure(lambda: apply(encoded, {}, store, verify=False))
    array = namespace["x"]
    return {
        "apply_s": apply_s,
        "apply_extra_mib": apply_mb,
        "apply_noverify_s": noverify_s,
        "bytes_fetched": report.bytes_fetched,
        "writable": bool(array.flags.writeable),
        "checksum": float(array[:: max(1, array.size // 1000)].sum()),
    }


def _child(role: str, payload: dict[str, Any]) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, __file__, "--role", role],
        input=json.dumps(payload, default=lambda b: b.hex()),
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(done.stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--mb", type=int, nargs="+", default=[100])
    parser.add_argument("--store", default=None, help="store directory (default: a temp dir)")
    parser.add_argument("--role", choices=["executor", "follower"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.role:
        payload = json.loads(sys.stdin.read())
        if args.role == "executor":
            result = executor(payload["mb"], payload["root"])
        else:
            result = follower(payload["entry"], payload["root"])
        print(json.dumps(result))
        return
    for size_mb in args.mb:
        with tempfile.TemporaryDirectory(dir=args.store) as root:
            sent = _child("executor", {"mb": size_mb, "root": root})
            entry = sent.pop("entry")
            got = _child("follower", {"entry": entry, "root": root})
            print(json.dumps({"size_mib": size_mb, **sent, **got}, indent=1))
            os.sync()


if __name__ == "__main__":
    main()
