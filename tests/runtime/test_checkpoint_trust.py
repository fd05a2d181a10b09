"""A resume reads only what a save wrote: manifests checked before DCP reads a byte, a crafted `.metadata` never
unpickled into a call, damaged checkpoints passed over for the newest intact one, each in one sentence."""
import json
import os
import pickle

import pytest

from planner.model import tiny_model
from runtime import checkpoint, manifest
from runtime.launch import main
from runtime.mesh import single_process_groups
from runtime.model import build_model
from runtime.parallel.data_parallel import build_optimizer
from tests.runtime.test_launch import _one_sentence, write_plan


def _optimizer():
    groups = single_process_groups()
    return build_optimizer([build_model(tiny_model("llama"), groups)], groups, "none"), groups


def _saved(ckpt, *steps):
    opt, groups = _optimizer()
    for step in steps:
        checkpoint.save(ckpt, step, opt, groups, plan_hash="ab" * 32)
    return opt, groups


class _RunsCode:
    """Unpickled, this calls os.system: what a crafted `.metadata` holds."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch '{self.marker}'",)


def test_a_save_writes_its_manifest_last_and_resume_checks_it(tmp_path, monkeypatch):
    ck = tmp_path / "ck"
    _saved(ck, 2)
    body = json.loads((ck / "step-00000002" / manifest.MANIFEST_FILE).read_text())
    assert body["step"] == 2 and body["plan_sha256"] == "ab" * 32 and body["source_tree"]
    assert sorted(body["files"]) == [".metadata", "__0_0.distcp"]
    distcp = ck / "step-00000002" / "__0_0.distcp"
    assert body["files"]["__0_0.distcp"] == {"bytes": distcp.stat().st_size, "sha256": manifest.sha256_file(distcp)}
    assert manifest.verify(ck / "step-00000002") is None
    data = bytearray(distcp.read_bytes())
    data[len(data) // 2] ^= 1  # one bit: the size is the same, only a hash sees it
    distcp.write_bytes(bytes(data))
    assert manifest.verify(ck / "step-00000002", full=False) == "file __0_0.distcp changed"  # a small file
    monkeypatch.setattr(manifest, "SMALL_FILE_BYTES", 1000)  # the quick check hashes only files up to this
    assert manifest.verify(ck / "step-00000002", full=False) is None
    monkeypatch.undo()
    assert manifest.verify(ck / "step-00000002") == "file __0_0.distcp changed"
    (ck / "step-00000002" / "extra.bin").write_bytes(b"x")
    assert manifest.verify(ck / "step-00000002") == "file extra.bin is not in its manifest"


def test_crafted_metadata_is_refused_before_anything_is_unpickled(tmp_path, capsys):
    """Replaced alone, `.metadata` fails its manifest and is never opened as a pickle; with a matching manifest
    written beside it (an attacker who can write the whole folder), the restricted unpickler stops at os.system.
    Either way nothing runs: the marker file the pickle would create does not exist."""
    ck, marker = tmp_path / "ck", tmp_path / "ran"
    opt, groups = _saved(ck, 2)
    step = ck / "step-00000002"
    (step / ".metadata").write_bytes(pickle.dumps(_RunsCode(marker)))
    with pytest.raises(checkpoint.CheckpointError) as exc:
        checkpoint.load(ck, opt, groups)
    assert str(exc.value).startswith("checkpoint step-00000002 fails its manifest (file .metadata is truncated): no "
                                     "checkpoint in"), exc.value
    manifest.write(step, 2)
    with pytest.raises(checkpoint.CheckpointError) as exc:
        checkpoint.load(ck, opt, groups)
    assert str(exc.value) == ("checkpoint step-00000002's .metadata is not DCP metadata (it names posix.system, "
                              "which checkpoint metadata never holds); nothing in it was run")
    plan = str(write_plan(tmp_path / "p.json", tp=1, micro_batch=2, sharding="none"))
    capsys.readouterr()
    assert main([plan, "--device", "cpu", "--nproc-per-node", "1", "--steps", "1", "--ckpt-dir", str(ck),
                 "--resume", "--results", str(tmp_path / "r.csv")]) == 1  # through torchrun: the worker refuses
    assert _one_sentence(capsys) == f"plan: {exc.value}"
    assert not marker.exists()


def test_damaged_checkpoint_falls_back_to_the_newest_intact_one(tmp_path, capsys):
    """A truncated file in step 4 beside an intact step 2: the launcher names step 4 and resumes from step 2
    (no 'does not fit this model', no traceback); a folder with no manifest at all is refused in one sentence."""
    ck = tmp_path / "ck"
    opt, groups = _saved(ck, 2, 4)
    distcp = ck / "step-00000004" / "__0_0.distcp"
    distcp.write_bytes(distcp.read_bytes()[:100])
    notes = []
    assert checkpoint.check_dir(ck, resume=True, report=notes.append) == 2
    assert notes == ["checkpoint step-00000004 fails its manifest (file __0_0.distcp is truncated); "
                     "resuming from step-00000002"]
    capsys.readouterr()
    assert checkpoint.load(ck, opt, groups) == 2
    assert capsys.readouterr().out == f"note: {notes[0]}\n"
    plan = str(write_plan(tmp_path / "p.json", tp=1, micro_batch=2, sharding="none"))
    base = [plan, "--device", "cpu", "--nproc-per-node", "1", "--steps", "1", "--ckpt-dir", str(ck), "--resume",
            "--results", str(tmp_path / "r.csv"), "--dry-run"]
    assert main(base) == 0
    assert capsys.readouterr().err == f"plan: {notes[0]}\n"
    for step in (2, 4):
        (ck / f"step-{step:08d}" / manifest.MANIFEST_FILE).unlink()
    assert main(base) == 1
    assert _one_sentence(capsys) == (
        f"plan: checkpoint step-00000004 has no manifest.json and 1 older one(s) fail too: no checkpoint in '{ck}' "
        "can be resumed from without reading files its save did not write (runtime/README.md, Checkpoints)")
