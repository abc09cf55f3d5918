"""Data at a local path or a storage URI (raybench/store.py), and a trial's files on their way to the
driver (artifacts.py): the same chips either way, errors that name the place."""

from __future__ import annotations

import uuid
from pathlib import Path

import numpy as np
import pytest
import torch

from raybench import store
from raybench.data import xview3 as x3
from raybench.data.chip import chip_scenes
from raybench.data.chipread import ChipParams
from raybench.data.chipset import ChipSet, chip_params_of
from raybench.data.labels import read_labels
from raybench.data.synth_xview3 import generate
from raybench.grid import expand
from raybench.runners.on_ray import artifacts
from raybench.spec import load_sweep
from tests.conftest import TINY_SWEEP

PARAMS = ChipParams(chip_size=128, overlap=16, channels=("vh", "vv", "bathymetry"))


def test_locations_join_and_name_without_folding_a_uri():
    assert store.join("s3://b/x/", "y", "z.csv") == "s3://b/x/y/z.csv"
    assert store.name("s3://b/x/y/") == "y" and store.parent("s3://b/x/y") == "s3://b/x"
    assert store.join("data", "a") == str(Path("data") / "a")
    assert store.identity("data") == str(Path("data").resolve())
    assert store.identity("gs://b/p") == "gs://b/p"


def test_local_writes_are_whole_and_listed(tmp_path):
    store.write_text(tmp_path / "a" / "f.txt", "hi")
    store.make_dirs(tmp_path / "a" / "sub")
    assert store.read_text(tmp_path / "a" / "f.txt") == "hi"
    assert store.list_dir(tmp_path / "a") == [("f.txt", False), ("sub", True)]  # no .tmp left
    store.remove_tree(tmp_path / "a")
    store.remove_tree(tmp_path / "a")  # already gone: nothing to do
    assert not (tmp_path / "a").exists()
    (tmp_path / "file").write_text("x")  # a folder cannot be made under a file
    assert store.check_writable(str(tmp_path / "file" / "out")) is not None


def test_an_object_store_reads_back_what_was_written(on_s3):
    root = f"s3://raybench/{uuid.uuid4().hex[:8]}"
    assert store.check_writable(root) is None
    store.write_text(store.join(root, "a", "f.txt"), "hi")
    assert store.is_dir(store.join(root, "a")) and store.is_file(store.join(root, "a", "f.txt"))
    assert store.list_dir(root) == [("a", True)]
    store.remove_tree(root)
    assert not store.is_dir(root)
    problem = store.check_writable("s3://no-such-bucket-here/chips")
    assert problem and "no-such-bucket-here" in problem


def test_gdal_gets_its_endpoint_from_the_aws_variable(monkeypatch):
    monkeypatch.delenv("AWS_ENDPOINT_URL_S3", raising=False)
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9000")
    assert store.gdal_settings() == {"AWS_S3_ENDPOINT": "127.0.0.1:9000", "AWS_HTTPS": "NO",
                                     "AWS_VIRTUAL_HOSTING": "FALSE"}
    monkeypatch.delenv("AWS_ENDPOINT_URL")
    assert store.gdal_settings() == {}  # AWS itself: GDAL's defaults


def test_chips_cut_from_and_into_a_uri_equal_local_ones(on_s3, tmp_path):
    """Scenes, labels and shorelines read from the store, chips written there and read back
    through ChipSet: byte for byte the local cut (the in-process runner; Ray adds only tasks)."""
    local = tmp_path
    generate(local / "synth", n=2, rows=300, cols=260, seed=4, density=200)
    remote = f"s3://raybench/{uuid.uuid4().hex[:8]}"
    store.upload_tree(local / "synth", store.join(remote, "synth"))
    scenes, labels = "synth/train", "synth/labels/train.csv"

    chip_scenes(local / scenes, local / labels, tmp_path / "chips", PARAMS, runner="local")
    chip_scenes(store.join(remote, scenes), store.join(remote, labels),
                store.join(remote, "chips"), PARAMS, runner="local")
    here = ChipSet(tmp_path / "chips", 128, 3)
    there = ChipSet(store.join(remote, "chips"), 128, 3)
    assert len(here) == len(there) > 0
    assert chip_params_of(store.join(remote, "chips"))["chip_size"] == 128
    for i in range(len(here)):
        (a, ta, ma), (b, tb, mb) = here[i], there[i]
        assert torch.equal(a, b) and ma == mb
        assert torch.equal(ta["boxes"], tb["boxes"]) and torch.equal(ta["labels"], tb["labels"])
    assert read_labels(store.join(remote, labels)).equals(read_labels(local / labels))
    sid = Path(x3.scene_dirs(local / "synth/validation")[0]).name
    for a, b in zip(x3.load_shoreline(x3.shoreline_path(local / "synth/shoreline/validation",
                                                        sid)),
                    x3.load_shoreline(x3.shoreline_path(f"{remote}/synth/shoreline/validation",
                                                        sid)), strict=True):
        np.testing.assert_array_equal(a, b)
    # a second run finds every scene done in the store and cuts nothing
    again = chip_scenes(store.join(remote, scenes), store.join(remote, labels),
                        store.join(remote, "chips"), PARAMS, runner="local")
    assert again["chips"] == 0 and again["scenes_skipped_done"] == 1


def test_a_trials_files_travel_whole_and_only_into_its_folder(tmp_path, write_sweep):
    trial = expand(load_sweep(write_sweep(TINY_SWEEP), ["measure.profile_steps=1"]))[0]
    node, driver = tmp_path / "node" / "trials", tmp_path / "driver" / "trials"
    folder = Path(artifacts.artifact_dir(str(node), trial))
    (folder / "epochs").mkdir(parents=True)
    (folder / "predictions.csv").write_text("a,b\n1,2\n")
    (folder / "epochs" / "epoch_001.pt").write_bytes(b"\x00" * 1000)
    trace = Path(artifacts.trace_path(str(node), trial))  # beside the trial's folder
    trace.write_text("{}")
    files = artifacts.collect(str(node), trial)
    assert sorted(rel for rel, _ in files) == sorted([f"{folder.name}/epochs/epoch_001.pt",
                                                      f"{folder.name}/predictions.csv",
                                                      trace.name])
    token = artifacts.mark(str(driver))
    assert artifacts.shared(str(driver), token) and not artifacts.shared(str(node), token)
    assert artifacts.unpack(str(driver), files) == 1000 + 8 + 2
    assert (driver / trace.name).read_text() == "{}"
    assert (driver / folder.name / "predictions.csv").read_text() == "a,b\n1,2\n"
    for bad in ("../escape.txt", "/etc/x", f"{folder.name}/../../x"):
        with pytest.raises(ValueError, match="refused artefact path"):
            artifacts.unpack(str(driver), [(bad, b"x")])
    assert not (tmp_path / "driver" / "escape.txt").exists()


def test_a_checkpoint_on_rank_0s_disk_is_named_by_its_copy(tmp_path):
    """No output.storage on nodes without a shared disk: Ray Train's path is on rank 0's node;
    the row names the copy that came with the trial's files (a URI stays as it is)."""
    from raybench.records import TrialOutcome
    from raybench.runners.on_ray.runner import _point_at_copy

    files = [("0000_k/checkpoint/model.pt", b"w"), ("0000_k/predictions.csv", b"p")]
    out = TrialOutcome(status="ok", metrics={"train/checkpoint": "/node/ray/ckpt_0"})
    _point_at_copy(out, str(tmp_path), "0000_k", files)
    assert out.metrics["train/checkpoint"] == str(tmp_path / "0000_k" / "checkpoint")
    out = TrialOutcome(status="ok", metrics={"train/checkpoint": "s3://b/ray/ckpt_0"})
    _point_at_copy(out, str(tmp_path), "0000_k", files)
    assert out.metrics["train/checkpoint"] == "s3://b/ray/ckpt_0"


def test_a_checkpoint_in_a_bucket_is_named_by_its_uri(tmp_path):
    import pyarrow.fs as pafs
    from ray.train import Checkpoint

    from raybench.runners.on_ray.train import checkpoint_uri

    local = Checkpoint(str(tmp_path))
    assert checkpoint_uri(local) == str(tmp_path)
    remote = Checkpoint("raybench/run/checkpoint_000000",
                        filesystem=pafs.S3FileSystem(anonymous=True, region="us-east-1"))
    assert checkpoint_uri(remote) == "s3://raybench/run/checkpoint_000000"
