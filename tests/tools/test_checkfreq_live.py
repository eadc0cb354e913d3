"""`%checkfreq` on a replicated kernel: the executor's host dies mid-training, another replica
resumes from the checkpoint and finishes the epoch exactly as an uninterrupted run would.

Real gateway, host agents, ReplicatedKernel processes and their Raft groups; the checkpoints go
to the kernel's folder of the fleet's object store (``KERNELFLEET_KERNEL_STORE``), which every
host reaches. The reference run is the same code in this test's own process.
"""

import re
import signal

import pytest

from kernelfleet.protocol import ErrorName

pytestmark = [
    pytest.mark.timeout(240),
    pytest.mark.slow,
    # torchdata 0.11 calls torch.set_vital, which torch 2.13 deprecates (the reference run here)
    pytest.mark.filterwarnings("ignore:'set_vital' is deprecated:UserWarning"),
]

SETUP = """
import torch
from torchdata.stateful_dataloader import StatefulDataLoader
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
data = torch.utils.data.TensorDataset(torch.randn(4096, 16), torch.randn(4096, 1))
loader = StatefulDataLoader(data, batch_size=8, shuffle=True)
"""

TRAIN = """
import time
steps = 0
for xb, yb in loader:
    loss = torch.nn.functional.mse_loss(model(xb), yb)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    steps += 1
    if steps % 50 == 0:
        print(f"step {steps}", flush=True)
    time.sleep(PAUSE)
weights = float(sum(p.detach().double().sum() for p in model.parameters()))
print(f"steps {steps} weights {weights:.9f}")
"""

BATCHES_PER_EPOCH = 4096 // 8


def reference_weights() -> float:
    """The uninterrupted run's weights after one epoch, computed here."""
    namespace: dict = {}
    exec(SETUP, namespace)
    exec(TRAIN.replace("PAUSE", "0"), namespace)
    return namespace["weights"]


def executor_host(fleet, kernel_id):
    view = fleet.api("GET", f"/api/fleet/kernels/{kernel_id}")
    hosts = {replica["id"]: replica["host"] for replica in view["replicas"]}
    return hosts[view["executor"]]


async def test_a_training_cell_whose_executor_host_dies_resumes_on_another_replica(
    private_fleet, capsys
):
    fleet = private_fleet(hosts=4, gpus=0, replicas=3)
    kernel_id = fleet.start_kernel()
    client = await fleet.connect(kernel_id)
    try:
        setup = await client.execute(SETUP + "\n%checkfreq on\n", timeout=90)
        assert setup.reply["status"] == "ok", setup.reply
        lost = executor_host(fleet, kernel_id)

        msg_id = client.send("execute_request", {"code": TRAIN.replace("PAUSE", "0.02")})
        await client.wait_for_output(msg_id, "step 250", timeout=90)
        fleet.signal_host(lost, signal.SIGKILL)
        cut = await client.collect(msg_id, timeout=60)
        assert cut.reply["status"] == "error"
        assert cut.reply["ename"] == ErrorName.REPLICA_LOST
        reached = max(int(n) for n in re.findall(r"step (\d+)", cut.stdout))

        resumed = await client.execute("r = %checkfreq resume\nprint('at', r.step)", timeout=90)
        assert resumed.reply["status"] == "ok", resumed.reply
        assert executor_host(fleet, kernel_id) != lost
        step = int(re.search(r"at (\d+)", resumed.stdout).group(1))
        assert 0 < step <= reached + 1, (step, reached)

        rest = await client.execute(TRAIN.replace("PAUSE", "0"), timeout=120)
        assert rest.reply["status"] == "ok", rest.reply
        found = re.search(r"steps (\d+) weights (\S+)", rest.stdout)
        assert int(found.group(1)) == BATCHES_PER_EPOCH - step, "the loader went on at its step"
        assert float(found.group(2)) == pytest.approx(reference_weights(), rel=1e-6, abs=1e-6)
        with capsys.disabled():
            print(f"\nexecutor lost at step {reached}; resumed from the checkpoint of step {step}")
    finally:
        client.close()
        fleet.api("DELETE", f"/api/kernels/{kernel_id}", expect=204)
