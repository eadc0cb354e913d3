"""The job-process SDK: what a background job's code calls (docs/jobs.md has the contract).

::

    from kernelfleet.jobs.sdk import current_job

    job = current_job()
    state = job.load_checkpoint() or {"step": 0, "model": fresh_model()}
    for step in range(state["step"], job.steps):
        train_one_step(state)
        job.report(step + 1)
        if job.should_stop or (step + 1) % 100 == 0:
            job.save_checkpoint({**state, "step": step + 1})
        if job.should_stop:
            break  # exit 0: the scheduler resumes the job later, from that checkpoint

- `Job.report` is cheap: it records the step and a thread of its own sends the latest one to
  the gateway at most every `REPORT_INTERVAL` seconds; a gateway that does not answer is
  retried later, never raised to the job.
- The stop request is SIGTERM: `Job.should_stop` turns True and the `Job.on_stop` callbacks run
  (in the main thread, between two Python bytecodes). The job then has the grace period
  (30 s by default) to checkpoint and exit 0; after it, SIGKILL, and the steps since its last
  checkpoint are lost (counted in the job's ``lost_steps``).
- Checkpoints are objects in the fleet's object store (`kernelfleet.kernels.objectstore`), in
  the job's folder ``KERNELFLEET_JOB_CHECKPOINT``; a pointer file names the latest, so a job
  killed while it saves resumes from the one before. Objects are ``torch.save``'d when the
  job imported torch, pickled otherwise.

``python -m kernelfleet.jobs.sdk FILE`` runs a job submitted as a function: FILE holds the
cloudpickle of a zero-argument callable.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import pickle
import signal
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kernelfleet.kernels.objectstore import LocalDirectoryStore, ObjectStoreError
from kernelfleet.protocol import JobEnv

REPORT_INTERVAL = 1.0
"""Seconds between two progress reports to the gateway (the latest step wins)."""
REPORT_TIMEOUT = 5.0
POINTER = "latest.json"


class Job:
    """The job this process runs, from its environment (`current_job`)."""

    def __init__(self, env: dict[str, str] | None = None) -> None:
        env = dict(os.environ if env is None else env)
        self.id = env.get(JobEnv.JOB_ID.value, "")
        self.steps = int(env.get(JobEnv.STEPS.value, "0") or 0)
        self._token = env.get(JobEnv.JOB_TOKEN.value, "")
        self._gateway = env.get(JobEnv.GATEWAY_URL.value, "").rstrip("/")
        checkpoint = env.get(JobEnv.CHECKPOINT.value, "")
        self.checkpoint_dir = Path(checkpoint) if checkpoint else None
        self._stop = threading.Event()
        self._callbacks: list[Callable[[], None]] = []
        self._lock = threading.Lock()
        self._pending: dict[str, Any] = {}
        self._wake = threading.Event()
        self._sender: threading.Thread | None = None
        self.step = 0

    # -- progress ---------------------------------------------------------------------------

    def report(self, step: int, throughput: float | None = None) -> None:
        """Record that the job reached `step` (of `steps`); `throughput` in steps/s, if the job
        measures it itself (else the gateway derives it from the steps' timing). Never raises."""
        self.step = int(step)
        with self._lock:
            self._pending["steps_done"] = self.step
            if throughput is not None:
                self._pending["throughput"] = float(throughput)
        self._start_sender()

    def flush(self) -> None:
        """Send what `report` recorded now (the SDK does at a checkpoint and at exit)."""
        self._send()

    # -- stopping ---------------------------------------------------------------------------

    @property
    def should_stop(self) -> bool:
        """True once the job was asked to stop (SIGTERM): checkpoint and exit 0."""
        return self._stop.is_set()

    def on_stop(self, callback: Callable[[], None]) -> None:
        """Call `callback()` when the stop request comes (at once if it came already)."""
        self._callbacks.append(callback)
        if self.should_stop:
            callback()

    def request_stop(self) -> None:
        """What SIGTERM does: set `should_stop` and run the `on_stop` callbacks."""
        if self._stop.is_set():
            return
        self._stop.set()
        for callback in list(self._callbacks):
            try:
                callback()
            except Exception as e:  # a callback's failure must not stop the others
                print(f"kernelfleet: an on_stop callback failed: {e!r}", file=sys.stderr)

    # -- checkpoints ------------------------------------------------------------------------

    def save_checkpoint(self, obj: Any, step: int | None = None) -> None:
        """Store `obj` (``torch.save``-able) as the job's latest checkpoint, taken at `step`
        (default: the last reported step), and tell the gateway."""
        folder = self._checkpoint_folder()
        store = LocalDirectoryStore(folder)
        data, form = _dumps(obj)
        key = store.put(data)
        step = self.step if step is None else int(step)
        previous = _read_pointer(folder)
        temporary = folder / f".{POINTER}.{os.getpid()}"
        temporary.write_text(json.dumps({"key": key, "step": step, "format": form}))
        os.replace(temporary, folder / POINTER)
        if previous is not None and previous.get("key") != key:
            with contextlib.suppress(ObjectStoreError, OSError, ValueError):
                store.delete(str(previous["key"]))
        with self._lock:
            self._pending["checkpoint_step"] = step
            self._pending.setdefault("steps_done", self.step)
        self._send()

    def load_checkpoint(self) -> Any | None:
        """The latest checkpoint's object, or None when the job has none yet."""
        if self.checkpoint_dir is None or not self.checkpoint_dir.is_dir():
            return None
        pointer = _read_pointer(self.checkpoint_dir)
        if pointer is None:
            return None
        data = LocalDirectoryStore(self.checkpoint_dir).get(str(pointer["key"]))
        return _loads(data, str(pointer.get("format", "pickle")))

    # -- plumbing ---------------------------------------------------------------------------

    def _checkpoint_folder(self) -> Path:
        if self.checkpoint_dir is None:
            raise RuntimeError(f"{JobEnv.CHECKPOINT.value} is not set: not a kernelfleet job?")
        self.checkpoint_dir.mkdir(mode=0o700, exist_ok=True)
        return self.checkpoint_dir

    def _start_sender(self) -> None:
        if self._sender is None and self._gateway:
            self._sender = threading.Thread(target=self._send_loop, daemon=True, name="report")
            self._sender.start()

    def _send_loop(self) -> None:
        while True:
            time.sleep(REPORT_INTERVAL)
            self._send()

    def _send(self) -> None:
        with self._lock:
            body, self._pending = self._pending, {}
        if not body or not self._gateway:
            return
        request = urllib.request.Request(
            f"{self._gateway}/api/fleet/jobs/{self.id}/progress",
            data=json.dumps(body).encode(),
            method="POST",
            headers={"Authorization": f"token {self._token}", "Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(request, timeout=REPORT_TIMEOUT):
                pass
        except (OSError, urllib.error.URLError):
            with self._lock:  # sent again with the next report; newer values win
                self._pending = {**body, **self._pending}


def _read_pointer(folder: Path) -> dict[str, Any] | None:
    try:
        pointer = json.loads((folder / POINTER).read_text())
    except (OSError, ValueError):
        return None
    return pointer if isinstance(pointer, dict) and "key" in pointer else None


def _dumps(obj: Any) -> tuple[bytes, str]:
    """`obj`'s bytes and their format: ``torch.save`` when the job uses torch (imported
    already: importing it only to save would cost seconds of the grace period), else pickle."""
    buffer = io.BytesIO()
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.save(obj, buffer)
        return buffer.getvalue(), "torch"
    pickle.dump(obj, buffer)
    return buffer.getvalue(), "pickle"


def _loads(data: bytes, form: str) -> Any:
    if form == "torch":
        import torch

        return torch.load(io.BytesIO(data), weights_only=False)
    return pickle.loads(data)


_job: Job | None = None


def current_job() -> Job:
    """This process's job (one per process), its SIGTERM handler installed on first call from
    the main thread, and its last report sent at exit."""
    global _job
    if _job is None:
        import atexit

        _job = Job()
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, lambda _signum, _frame: _stopped())
        atexit.register(_job.flush)
    return _job


def _stopped() -> None:
    if _job is not None:
        _job.request_stop()


def main(argv: list[str] | None = None) -> int:
    """Run the pickled zero-argument callable in the file `argv[0]` (a job submitted as a
    function); its return value is printed."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m kernelfleet.jobs.sdk FUNCTION_FILE", file=sys.stderr)
        return 2
    import cloudpickle

    current_job()
    with open(args[0], "rb") as f:
        function = cloudpickle.load(f)
    result = function()
    if result is not None:
        print(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
