"""CheckFreq in one process: checkpoints of a hooked loop, their atomic layout, resume, and the
bad inputs (a folder that cannot be written, a model that cannot be snapshotted, no checkpoint)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
import torch

from kernelfleet.tools.checkfreq import CheckFreq, CheckpointError
from kernelfleet.tools.checkfreq.store import CheckpointStore
from tests.tools.checkfreq_setup import train, training_objects

pytestmark = pytest.mark.filterwarnings("ignore:'set_vital' is deprecated:UserWarning")


def checkpoints(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


def test_a_hooked_loop_is_checkpointed_every_k_steps_and_resumes_exactly(tmp_path):
    objects = training_objects()
    cf = CheckFreq(tmp_path, namespace=objects, profile_steps=3)
    cf.attach()
    first = train(objects, 30)
    cf.detach()
    status = cf.status()
    # the interval is chosen once the first checkpoint persisted: on a fast machine, after these
    # 30 steps of under a millisecond
    assert status.frequency is None or status.frequency >= 1
    assert status.last_step is not None
    assert 4 <= status.last_step <= 30
    assert status.iter_s
    assert status.snapshot_s
    assert status.persist_s
    assert status.step == 30
    assert not status.in_flight
    assert status.last_error is None
    names = checkpoints(tmp_path)
    assert "latest" in names
    assert not [n for n in names if n.startswith(".")]
    assert 1 <= len([n for n in names if n.startswith("step-")]) <= 2  # pruned to the last two
    last = cf.last_step

    # a new process's view: fresh objects, the newest checkpoint restored into them
    again = training_objects(seed=1)
    report = CheckFreq(tmp_path, namespace=again).resume()
    assert report.step == last
    assert report.restored == ["loader", "model", "optimizer", "scheduler"]
    assert train(again, 30, start=last) == first[last:]


def test_the_explicit_api_and_checkpoint_now(tmp_path):
    objects = training_objects()
    cf = CheckFreq(tmp_path, namespace=objects, profile_steps=1000)
    cf.attach()
    train(objects, 3)
    assert cf.status().last_step is None  # still profiling
    assert cf.checkpoint_now() == 3
    cf.detach()
    model = objects["model"]
    plain = {"model": model}  # a loop without a torch optimizer calls step() itself
    cf = CheckFreq(tmp_path / "explicit", namespace=plain, profile_steps=2)
    cf.attach()
    for _ in range(8):
        with torch.no_grad():
            model[0].weight.add_(1.0)
        cf.step()
    cf.detach()
    assert cf.status().last_step is not None
    saved = cf.status().last_step
    with torch.no_grad():
        model[0].weight.zero_()
    assert CheckFreq(tmp_path / "explicit", namespace=plain).resume().step == saved
    assert model[0].weight.min() > 0


def test_resume_without_a_checkpoint_says_so(tmp_path):
    with pytest.raises(CheckpointError, match=r"no checkpoint to resume from in .*empty"):
        CheckFreq(tmp_path / "empty", namespace={}).resume()
    with pytest.raises(CheckpointError, match="no checkpoint"):
        CheckFreq.saved_settings(tmp_path / "empty")


def test_resume_names_the_objects_the_namespace_lacks(tmp_path):
    objects = training_objects()
    cf = CheckFreq(tmp_path, namespace=objects)
    cf.attach()
    train(objects, 2)
    cf.checkpoint_now()
    cf.detach()
    partial = {"model": objects["model"], "loader": objects["loader"], "optimizer": 3}
    with pytest.raises(CheckpointError, match=r"optimizer \(optimizer\), scheduler"):
        CheckFreq(tmp_path, namespace=partial).resume()


class Unsaveable(torch.nn.Linear):
    def get_extra_state(self):
        return lambda: "a closure"

    def set_extra_state(self, state):
        pass


@pytest.mark.parametrize(
    ("model", "why"),
    [
        (torch.nn.Linear(2, 2, device="meta"), "meta device"),
        (Unsaveable(2, 2), "Can't pickle|Can't get local object|lambda"),
    ],
)
def test_a_model_that_cannot_be_snapshotted_is_refused_by_name(tmp_path, model, why):
    cf = CheckFreq(tmp_path, namespace={"net": model})
    with pytest.raises(CheckpointError, match=rf"cannot snapshot 'net' \(module\): .*({why})"):
        cf.attach()
    assert not cf.status().enabled
    assert not [p for p in tmp_path.iterdir() if p.name.startswith("step-")]


def test_an_unwritable_folder_is_refused_at_attach(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    with pytest.raises(CheckpointError, match=r"cannot write checkpoints to .*a-file/ck"):
        CheckFreq(blocker / "ck", namespace=training_objects()).attach()


def test_a_folder_gone_mid_training_is_told_once_and_training_goes_on(tmp_path, capfd):
    folder = tmp_path / "ck"
    objects = training_objects()
    cf = CheckFreq(folder, namespace=objects, profile_steps=2, max_overhead=0.9)
    cf.attach()
    train(objects, 6)
    cf.wait()
    good = cf.status().last_step
    assert good is not None
    shutil.rmtree(folder)
    folder.write_text("not a folder any more")  # every later checkpoint fails
    cf.tuner.interval = 2
    seen = train(objects, 20, start=6)
    cf.wait()
    assert len(seen) == 14  # training went on
    err = capfd.readouterr().err
    assert err.count("checkfreq:") == 1, err
    assert "cannot write checkpoints to" in err
    assert "training goes on" in err
    assert cf.status().last_step == good
    assert cf.status().last_error
    folder.unlink()  # the folder is back: checkpoints succeed again, and the error is cleared
    folder.mkdir()
    train(objects, 26, start=20)
    cf.checkpoint_now()
    cf.detach()
    assert cf.status().last_error is None
    assert cf.status().last_step > 20
    assert CheckpointStore(folder).newest() is not None


def test_a_partial_checkpoint_is_never_resumed_from(tmp_path):
    objects = training_objects()
    cf = CheckFreq(tmp_path, namespace=objects)
    cf.attach()
    train(objects, 2)
    cf.checkpoint_now()
    train(objects, 4, start=2)
    cf.checkpoint_now()
    cf.detach()
    store = CheckpointStore(tmp_path)
    assert store.newest() == tmp_path / "step-000000000004"
    # a writer killed after the rename, before the pointer; and one killed before the rename
    (tmp_path / "step-000000000004" / "checkfreq.json").unlink()
    os.makedirs(tmp_path / ".partial-step-000000000006-1")
    assert store.newest() == tmp_path / "step-000000000002"
    assert CheckFreq(tmp_path, namespace=training_objects()).resume().step == 2
    (tmp_path / "latest").write_text("garbage\n")
    assert store.newest() == tmp_path / "step-000000000002"
    store.prepare()  # sweeps what dead writers left
    assert not (tmp_path / ".partial-step-000000000006-1").exists()
