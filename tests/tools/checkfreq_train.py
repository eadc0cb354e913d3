"""A seeded CPU training loop under CheckFreq, run as a subprocess by test_checkfreq_resume.py.

    python checkfreq_train.py DIR STEPS LOG [--resume] [--kill-at N]

Appends one line per step to LOG: ``step loss batch-indices``. With ``--resume`` it first loads
the newest checkpoint from DIR (a fresh process: the objects are made anew, then restored).
With ``--kill-at N`` it SIGKILLs itself right after step N's line (a host that vanished).
The loop itself has no checkpointing code: CheckFreq hooks ``optimizer.step``.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import sys
import warnings

warnings.filterwarnings("ignore", message=".*set_vital", category=UserWarning)
warnings.filterwarnings("ignore", category=UserWarning, module="torchdata")

import numpy  # noqa: E402
import torch  # noqa: E402
from torch.utils.data import TensorDataset  # noqa: E402
from torchdata.stateful_dataloader import StatefulDataLoader  # noqa: E402

from kernelfleet.tools.checkfreq import CheckFreq, CheckpointError  # noqa: E402


def main(argv: list[str]) -> int:
    directory, steps, log_path = argv[0], int(argv[1]), argv[2]
    kill_at = int(argv[argv.index("--kill-at") + 1]) if "--kill-at" in argv else None
    torch.manual_seed(0)
    random.seed(0)
    numpy.random.seed(0)
    x = torch.randn(96, 8)
    y = (x @ torch.randn(8, 1) + 0.1 * torch.randn(96, 1)).squeeze(1)
    ids = torch.arange(96)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Dropout(0.1),
                                torch.nn.BatchNorm1d(16), torch.nn.Linear(16, 1))  # fmt: skip
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=7, gamma=0.9)
    loader = StatefulDataLoader(TensorDataset(x, y, ids), batch_size=10, shuffle=True)
    namespace = {"model": model, "optimizer": optimizer, "scheduler": scheduler, "loader": loader}
    cf = CheckFreq(directory, namespace=namespace, profile_steps=3)
    start = 0
    if "--resume" in argv:
        with contextlib.suppress(CheckpointError):  # killed before its first checkpoint
            start = cf.resume().step
    cf.attach()
    step = start
    with open(log_path, "a") as log:
        while step < steps:
            for xb, yb, idb in loader:
                noise = random.random() * 1e-3 + float(numpy.random.rand()) * 1e-3
                loss = torch.nn.functional.mse_loss(model(xb).squeeze(1), yb) + noise
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                scheduler.step()
                step += 1
                log.write(f"{step} {loss.item():.10f} {' '.join(map(str, idb.tolist()))}\n")
                log.flush()
                if step == kill_at:
                    os.kill(os.getpid(), signal.SIGKILL)
                if step >= steps:
                    break
    cf.detach()
    if "--threads" in argv:
        import threading

        print([t.name for t in threading.enumerate()], file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
