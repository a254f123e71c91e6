"""A checkpoint's manifest proves it ours and intact before torch reads it; Save and Load paths stay in their roots."""

import json
from pathlib import Path

import pytest

from services.common import auth
from services.trainer.checkpoint import confine
from services.trainer.manifest import MANIFEST, verify_manifest, write_manifest

SECRET, OTHER = "ab" * 32, "cd" * 32


def _checkpoint(folder: Path) -> Path:
    (folder / "train_state").mkdir(parents=True)
    (folder / "train_state" / ".metadata").write_bytes(b"metadata")
    (folder / "train_state" / "__0_0.distcp").write_bytes(b"shard" * 100)
    (folder / "model.safetensors").write_bytes(b"weights")
    write_manifest(folder)
    return folder


def _refused(folder: Path, *words: str) -> None:
    with pytest.raises(ValueError) as err:
        verify_manifest(folder, complete=("train_state",))
    assert all(w in str(err.value) for w in words), str(err.value)


def test_a_signed_checkpoint_verifies_and_files_beside_train_state_may_be_added(tmp_path, monkeypatch):
    monkeypatch.setattr(auth, "_secret", SECRET)
    folder = _checkpoint(tmp_path / "ckpt")
    doc = json.loads((folder / MANIFEST).read_text())
    assert [e["path"] for e in doc["files"]] == [
        "model.safetensors",
        "train_state/.metadata",
        "train_state/__0_0.distcp",
    ]
    assert len(bytes.fromhex(doc["signature"])) == 32 and not (folder / f"{MANIFEST}.tmp").exists()
    (folder / "run_state.json").write_text("{}")  # the coordinator's part, written after the trainer's
    verify_manifest(folder, complete=("train_state",))


def test_another_secret_or_none_is_not_ours(tmp_path, monkeypatch):
    monkeypatch.setattr(auth, "_secret", OTHER)
    other = _checkpoint(tmp_path / "other")
    monkeypatch.setattr(auth, "_secret", None)
    unsigned = _checkpoint(tmp_path / "unsigned")
    verify_manifest(other, complete=("train_state",))  # unlocked: hashes only
    monkeypatch.setattr(auth, "_secret", SECRET)
    for folder in (other, unsigned):
        _refused(folder, "signature", "not written by this run")


def test_altered_missing_unlisted_or_unsigned_files_are_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(auth, "_secret", SECRET)
    same_size = _checkpoint(tmp_path / "a")
    (same_size / "train_state" / "__0_0.distcp").write_bytes(b"shard" * 99 + b"SHARD")
    _refused(same_size, "sha256 of train_state/__0_0.distcp", "altered")
    cut = _checkpoint(tmp_path / "b")
    (cut / "model.safetensors").write_bytes(b"w")
    _refused(cut, "model.safetensors has 1 bytes")
    missing = _checkpoint(tmp_path / "c")
    (missing / "train_state" / ".metadata").unlink()
    _refused(missing, ".metadata", "missing")
    planted = _checkpoint(tmp_path / "d")
    (planted / "train_state" / "__1_0.distcp").write_bytes(b"x")
    _refused(planted, "train_state/__1_0.distcp is not listed")
    linked = _checkpoint(tmp_path / "e")
    (linked / "train_state" / "more").symlink_to(tmp_path / "a")
    _refused(linked, "train_state/more is not listed")
    bare = _checkpoint(tmp_path / "f")
    (bare / MANIFEST).unlink()
    _refused(bare, "has no manifest.json", "not written by this run")


def test_a_malformed_manifest_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(auth, "_secret", None)
    folder = _checkpoint(tmp_path / "ckpt")
    doc = json.loads((folder / MANIFEST).read_text())
    for bad, words in [
        ({**doc, "files": [{**doc["files"][0], "path": "../x"}]}, "outside its folder"),
        ({**doc, "files": [{**doc["files"][0], "num_bytes": "7"}]}, "malformed"),
        ({**doc, "signature": "zz"}, "malformed"),
        ({"files": doc["files"]}, "malformed"),
        ([1], "malformed"),
    ]:
        (folder / MANIFEST).write_text(json.dumps(bad))
        _refused(folder, words)


def test_confine_follows_links_and_refuses_every_way_out(tmp_path):
    root, elsewhere = tmp_path / "runs" / "r1", tmp_path / "elsewhere"
    root.mkdir(parents=True)
    elsewhere.mkdir()
    (root / "link").symlink_to(elsewhere)
    assert confine(str(root / "resume" / "step_2"), [root]) == root / "resume" / "step_2"
    assert confine(str(elsewhere / "x"), [root, elsewhere]) == elsewhere / "x"
    for path in (elsewhere / "x", root / ".." / "r2" / "x", root / "link" / "x", root, tmp_path / "runs"):
        with pytest.raises(ValueError) as err:
            confine(str(path), [root])
        assert str(path) in str(err.value) and f"outside {root}" in str(err.value)
