"""The run record: checkpoint completeness, pruning, and cutting the appended files back on resume."""

import json

from services.coordinator.run_record import RUN_STATE, CoordinatorState, RunRecord


def _checkpoint(record: RunRecord, step: int, complete: bool = True) -> None:
    folder = record.checkpoint_dir(step)
    (folder / "train_state").mkdir(parents=True)
    (folder / "train_state" / "shard").write_bytes(b"x")
    if complete:
        record.write_state(folder, CoordinatorState(step, step, step * 4, 1.0, 2.0, offsets=record.offsets()))


def test_the_newest_complete_checkpoint_is_resumed_and_an_incomplete_one_never(tmp_path):
    record = RunRecord(tmp_path)
    assert record.latest() is None
    _checkpoint(record, 2)
    _checkpoint(record, 4, complete=False)  # the trainer wrote its part, the coordinator died before its own
    folder, state = record.latest()
    assert folder.name == "step_2" and (state.step, state.data_cursor) == (2, 8)
    assert not list(folder.glob("*.tmp"))


def test_prune_keeps_the_newest_complete_checkpoints(tmp_path):
    record = RunRecord(tmp_path)
    for step in (1, 2, 3):
        _checkpoint(record, step)
    _checkpoint(record, 4, complete=False)
    record.prune(keep=2)
    assert sorted(p.name for p in (tmp_path / "resume").iterdir()) == ["step_2", "step_3", "step_4"]


def test_cut_back_removes_rows_written_after_the_checkpoint(tmp_path):
    record = RunRecord(tmp_path)
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text('{"step": 1}\n{"step": 2}\n')
    offsets = record.offsets()
    with metrics.open("a") as f:
        f.write('{"step": 3}\n{"st')  # a step the run finished after the checkpoint, and a row cut by kill -9
    (tmp_path / "refits.jsonl").write_text('{"step": 3}\n')  # a file the checkpoint did not have
    record.cut_back(offsets)
    assert [json.loads(line)["step"] for line in metrics.read_text().splitlines()] == [1, 2]
    assert (tmp_path / "refits.jsonl").read_text() == ""


def test_checkpoints_list_forgets_the_steps_being_redone(tmp_path):
    record = RunRecord(tmp_path)
    for step in (2, 4, 6):
        record.note_checkpoint({"step": step})
    record.forget_checkpoints_after(4)
    rows = (tmp_path / "checkpoints.jsonl").read_text().splitlines()
    assert [json.loads(r)["step"] for r in rows] == [2, 4]


def test_run_state_is_written_last(tmp_path):
    record = RunRecord(tmp_path)
    _checkpoint(record, 1)
    assert json.loads((record.checkpoint_dir(1) / RUN_STATE).read_text())["policy_version"] == 1


def test_a_damaged_run_state_is_skipped_for_the_checkpoint_before_it(tmp_path):
    record = RunRecord(tmp_path)
    _checkpoint(record, 2)
    _checkpoint(record, 4)
    (record.checkpoint_dir(4) / RUN_STATE).write_text('{"step": 4, "policy_')
    folder, state = record.latest()
    assert folder.name == "step_2" and state.step == 2


def test_the_wanted_rollout_workers_travel_and_an_older_run_state_without_them_still_loads(tmp_path):
    record = RunRecord(tmp_path)
    folder = record.checkpoint_dir(3)
    folder.mkdir(parents=True)
    record.write_state(folder, CoordinatorState(3, 3, 12, 1.0, 2.0, num_rollout_workers=4))
    assert record.latest()[1].num_rollout_workers == 4
    state = json.loads((folder / RUN_STATE).read_text())
    del state["num_rollout_workers"]  # written before ScaleRollout existed
    (folder / RUN_STATE).write_text(json.dumps(state))
    assert record.latest()[1].num_rollout_workers == 0


def test_a_resume_removes_what_the_steps_it_redoes_left_behind(tmp_path):
    """A run killed after step 4's HF export but before its resumable checkpoint resumes at step 2: the redone step
    4 must find its folders free (the trainer never overwrites one), and step 2's stay."""
    import json

    from services.coordinator.run_record import RunRecord

    record = RunRecord(tmp_path)
    for folder in (record.export_dir(2), record.export_dir(4), record.checkpoint_dir(2), record.checkpoint_dir(4)):
        folder.mkdir(parents=True)
        (folder / "model.safetensors").write_bytes(b"x")
    (tmp_path / "checkpoints.jsonl").write_text("".join(json.dumps({"step": s}) + "\n" for s in (2, 4)))
    record.forget_checkpoints_after(2)
    assert record.export_dir(2).is_dir() and record.checkpoint_dir(2).is_dir()
    assert not record.export_dir(4).exists() and not record.checkpoint_dir(4).exists()
    assert [json.loads(line)["step"] for line in (tmp_path / "checkpoints.jsonl").read_text().splitlines()] == [2]
