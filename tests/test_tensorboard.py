"""TensorBoard event files of the metrics records (issue 19 item 5): fedjax_lama.metrics.

The files are read back without TensorBoard or TensorFlow: the TFRecord framing (length,
masked CRC32C of the length, payload, masked CRC32C of the payload) is parsed here and each
payload decoded with tensorboardX's own Event protobuf.
"""
import glob
import json
import os
import struct
import time

import numpy as np
import pytest

tensorboardX = pytest.importorskip("tensorboardX")
from tensorboardX.proto import event_pb2  # pylint: disable=g-import-not-at-top
from tensorboardX.record_writer import masked_crc32c  # pylint: disable=g-import-not-at-top

from fedjax_lama import metrics  # pylint: disable=g-import-not-at-top


def read_events(path):
  """Every Event of one event file, checking the framing and both CRCs of every record."""
  events = []
  with open(path, "rb") as f:
    data = f.read()
  pos = 0
  while pos < len(data):
    header = data[pos:pos + 8]
    (length,) = struct.unpack("<Q", header)
    (header_crc,) = struct.unpack("<I", data[pos + 8:pos + 12])
    assert header_crc == masked_crc32c(header), f"bad length CRC at byte {pos} of {path}"
    payload = data[pos + 12:pos + 12 + length]
    (payload_crc,) = struct.unpack("<I", data[pos + 12 + length:pos + 16 + length])
    assert payload_crc == masked_crc32c(payload), f"bad payload CRC at byte {pos} of {path}"
    event = event_pb2.Event()
    event.ParseFromString(payload)
    events.append(event)
    pos += 16 + length
  assert pos == len(data), f"{path} ends inside a record"
  return events


def event_files(logdir):
  files = sorted(glob.glob(os.path.join(logdir, "events.out.tfevents.*")))
  assert files, f"no event files in {logdir}: {os.listdir(logdir)}"
  return files


def scalars_by_tag(logdir):
  """{tag: [(step, value), ...]} as TensorBoard shows them: files in name order, and a
  SessionLog.START at step T (tensorboardX's purge_step) hides every earlier event with
  step >= T (TensorBoard's event_accumulator purge on restart)."""
  out = {}
  for path in event_files(logdir):
    for event in read_events(path):
      if event.HasField("session_log") and event.session_log.status == event_pb2.SessionLog.START:
        out = {tag: [(s, v) for s, v in pts if s < event.step] for tag, pts in out.items()}
      if event.HasField("summary"):
        for value in event.summary.value:
          out.setdefault(value.tag, []).append((event.step, value.simple_value))
  return out


RECORDS = [
    {"round": 2, "local_steps": 20, "test_accuracy": 0.5, "test_loss": 1.25,
     "train_loss": np.float32(1.5), "comm_floats_up": 835904, "comm_floats_down": 835904,
     "wall_seconds": 1.0, "fedlama_discrepancy": [0.1, 0.2], "note": "text",
     "flag": True, "val_accuracy": None, "extra": {"inner": np.int64(3)}},
    {"round": 4, "local_steps": 40, "test_accuracy": 0.625, "test_loss": 1.0,
     "train_loss": np.float32(1.25), "comm_floats_up": 1671808, "comm_floats_down": 1671808,
     "wall_seconds": 2.0, "fedlama_discrepancy": [0.1, 0.2], "note": "text",
     "flag": False, "val_accuracy": None, "extra": {"inner": np.int64(4)}},
    {"round": 6, "local_steps": 60, "test_accuracy": 0.75, "test_loss": 0.75,
     "train_loss": np.float32(1.0), "comm_floats_up": 2507712, "comm_floats_down": 2507712,
     "wall_seconds": 3.0, "fedlama_discrepancy": [0.1, 0.2], "note": "text",
     "flag": True, "val_accuracy": np.array(0.5), "extra": {"inner": np.int64(5)}},
]
NUMERIC = ("round", "local_steps", "test_accuracy", "test_loss", "train_loss",
           "comm_floats_up", "comm_floats_down", "wall_seconds")


def test_write_tags_steps_and_values(tmp_path):
  logdir = str(tmp_path / "tb")
  with metrics.TensorBoardWriter(logdir) as tb:
    for record in RECORDS:
      tb.write(record)
  (path,) = event_files(logdir)
  events = read_events(path)
  assert events[0].file_version == "brain.Event:2"
  got = scalars_by_tag(logdir)
  # Lists, strings, booleans and None are skipped; a 0-d array only where it is a number.
  assert set(got) == set(NUMERIC) | {"extra/inner", "val_accuracy"}
  for tag in NUMERIC:
    assert [s for s, _ in got[tag]] == [20, 40, 60], tag  # step = local_steps
    np.testing.assert_allclose([v for _, v in got[tag]], [float(r[tag]) for r in RECORDS],
                               rtol=1e-6, err_msg=tag)
  assert got["round"] == [(20, 2.0), (40, 4.0), (60, 6.0)]  # the round, at its local step
  assert got["extra/inner"] == [(20, 3.0), (40, 4.0), (60, 5.0)]
  assert got["val_accuracy"] == [(60, 0.5)]
  # Every event after the file header is a scalar summary with a wall time.
  assert all(e.HasField("summary") and e.wall_time > 0 for e in events[1:])


def test_scalars_selection():
  assert metrics.TensorBoardWriter.scalars(RECORDS[0]) == {
      "round": 2.0, "local_steps": 20.0, "test_accuracy": 0.5, "test_loss": 1.25,
      "train_loss": 1.5, "comm_floats_up": 835904.0, "comm_floats_down": 835904.0,
      "wall_seconds": 1.0, "extra/inner": 3.0}


def test_record_without_local_steps_is_rejected(tmp_path):
  with metrics.TensorBoardWriter(str(tmp_path)) as tb:
    with pytest.raises(ValueError, match="local_steps"):
      tb.write({"round": 1, "test_accuracy": 0.5})


def test_resume_purges_the_crashed_tail(tmp_path):
  """A run killed after writing rounds 2, 4, 6 and resumed from the checkpoint of round 4
  rewrites round 6: the second writer (same logdir, within the same second) keeps the
  first file intact, and its purge step hides the crashed run's step-60 events."""
  logdir = str(tmp_path / "tb")
  with metrics.TensorBoardWriter(logdir) as tb:
    for record in RECORDS:
      tb.write(record)
  kept = RECORDS[:2]
  assert metrics.resume_purge_step(kept) == 41
  assert metrics.resume_purge_step([]) == 0
  rerun = dict(RECORDS[2], test_accuracy=0.875)
  with metrics.TensorBoardWriter(logdir, purge_step=metrics.resume_purge_step(kept)) as tb:
    tb.write(rerun)
  first, second = event_files(logdir)  # name order is creation order
  written = sum(len(metrics.TensorBoardWriter.scalars(r)) for r in RECORDS)
  assert len(read_events(first)) == 1 + written  # the file header, then every scalar
  starts = [e.step for e in read_events(second) if e.HasField("session_log")]
  assert starts == [41]
  got = scalars_by_tag(logdir)
  assert got["test_accuracy"] == [(20, 0.5), (40, 0.625), (60, 0.875)]
  assert got["round"] == [(20, 2.0), (40, 4.0), (60, 6.0)]


def test_export_from_metrics_jsonl(tmp_path):
  workdir = tmp_path / "run"
  workdir.mkdir()
  writer = metrics.JsonlWriter(str(workdir / "metrics.jsonl"))
  for record in RECORDS:
    writer.write(record)
  logdir = metrics.export_tensorboard(str(workdir))
  assert logdir == str(workdir / "tensorboard")
  got = scalars_by_tag(logdir)
  assert got["test_accuracy"] == [(20, 0.5), (40, 0.625), (60, 0.75)]
  # Exporting again replaces the earlier export (purge_step=0), it does not double it.
  time.sleep(0.01)
  metrics.export_tensorboard(str(workdir))
  assert len(event_files(logdir)) == 2
  assert scalars_by_tag(logdir)["test_accuracy"] == [(20, 0.5), (40, 0.625), (60, 0.75)]
  assert json.loads((workdir / "metrics.jsonl").read_text().splitlines()[0])["round"] == 2


def test_tensorboard_reads_them_when_installed(tmp_path):
  """The same files through TensorBoard's own reader, where tensorboard is installed
  (it is not a requirement): the values, and the purge of a resumed run's crashed tail."""
  ea = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")
  logdir = str(tmp_path / "tb")
  with metrics.TensorBoardWriter(logdir) as tb:
    for record in RECORDS:
      tb.write(record)
  acc = ea.EventAccumulator(logdir)
  acc.Reload()
  assert [(e.step, e.value) for e in acc.Scalars("test_accuracy")] == [
      (20, 0.5), (40, 0.625), (60, 0.75)]
  assert "fedlama_discrepancy" not in acc.Tags()["scalars"]
  with metrics.TensorBoardWriter(logdir, purge_step=metrics.resume_purge_step(RECORDS[:2])) as tb:
    tb.write(dict(RECORDS[2], test_accuracy=0.875))
  acc = ea.EventAccumulator(logdir)
  acc.Reload()
  assert [(e.step, e.value) for e in acc.Scalars("test_accuracy")] == [
      (20, 0.5), (40, 0.625), (60, 0.875)]
