"""`ReplayBackend` over Zeus's power tables (skipped where the tables are absent)."""

import csv

import pytest

from kernelfleet.tools.energy.errors import SettingUnavailable, TraceNotFound
from kernelfleet.tools.energy.replay import ReplayBackend, find_workload, trace_folder, workloads


def test_every_gpu_table_is_found_and_named(zeus_trace):
    found = {str(w) for w in workloads(zeus_trace)}
    assert len(found) == 25  # 4 GPUs x 6 workloads, and V100 cifar100 with two optimizers
    assert "v100:imagenet/resnet50/adadelta" in found
    assert str(find_workload("a40:squad/bert_base_uncased", zeus_trace)) == (
        "a40:squad/bert_base_uncased/adamw"
    )


def test_a_setting_costs_the_tables_epoch_time_and_time_times_power(zeus_trace):
    backend = ReplayBackend.from_spec("v100:imagenet/resnet50", zeus_trace)
    with (zeus_trace / "summary_power_v100.csv").open() as f:
        rows = [r for r in csv.DictReader(f) if r["dataset"] == "imagenet"]
    assert backend.space().size == len(rows) == 56
    for row in rows:
        setting = {"power_limit": float(row["power_limit"]), "batch": float(row["batch_size"])}
        measured = backend.measure(setting)
        seconds = float(row["time_per_epoch"])
        assert measured.latency_s == seconds
        assert measured.energy_j == pytest.approx(seconds * float(row["average_power"]))


def test_the_default_is_the_maximum_of_each_knob(zeus_trace):
    space = ReplayBackend.from_spec("p100:squad/bert_base_uncased", zeus_trace).space()
    assert space.default() == {"power_limit": 250.0, "batch": 24.0}
    only_power = ReplayBackend.from_spec("p100:squad/bert_base_uncased", zeus_trace)
    assert only_power.space(["power_limit"]).names == ("power_limit",)


def test_a_pair_zeus_did_not_measure_is_unavailable(zeus_trace):
    backend = ReplayBackend.from_spec("rtx6000:movielens-1m/ncf", zeus_trace)
    missing = [s for s in backend.space().grid() if not backend.covers(s)]
    assert missing  # bs 4 was measured only at some power limits
    with pytest.raises(SettingUnavailable, match="no row for power_limit"):
        backend.measure(missing[0])


def test_tables_that_do_not_exist_are_refused_by_name(zeus_trace, tmp_path, monkeypatch):
    with pytest.raises(TraceNotFound, match="there are v100:cifar100"):
        find_workload("v100:mnist/lenet", zeus_trace)
    with pytest.raises(TraceNotFound, match="ambiguous: v100:cifar100/shufflenetv2/adadelta"):
        find_workload("v100:cifar100/shufflenetv2", zeus_trace)
    with pytest.raises(TraceNotFound, match="GPU:DATASET/NETWORK"):
        find_workload("v100-imagenet", zeus_trace)
    with pytest.raises(TraceNotFound, match="there are GPUs a40, p100, rtx6000, v100"):
        find_workload("h100:imagenet/resnet50", zeus_trace)
    with pytest.raises(TraceNotFound, match=f"no summary_power_<gpu>.csv in {tmp_path}"):
        trace_folder(tmp_path)
    monkeypatch.delenv("KERNELFLEET_ZEUS_TRACE", raising=False)
    with pytest.raises(TraceNotFound, match="set KERNELFLEET_ZEUS_TRACE"):
        trace_folder()
    monkeypatch.setenv("KERNELFLEET_ZEUS_TRACE", str(zeus_trace))
    assert trace_folder() == zeus_trace
