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
                              "which checkpoint metadata never holds); nothing in it was run: no checkpoint in "
                              f"'{ck}' can be resumed from without reading files its save did not write "
                              "(runtime/README.md, Checkpoints)")
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


def _forge_storage(step_folder, name: str) -> None:
    """Rewrite `.metadata` so that its first storage entry names `name`, and write a manifest matching the forged
    folder (an attacker who can write the whole folder)."""
    metadata = manifest.load_metadata((step_folder / ".metadata").read_bytes())
    first = next(iter(metadata.storage_data))
    metadata.storage_data[first].relative_path = name
    (step_folder / ".metadata").write_bytes(pickle.dumps(metadata))
    manifest.write(step_folder, int(step_folder.name[5:]))


@pytest.mark.parametrize("name", ["../step-00000002/__0_0.distcp", "/etc/passwd", "manifest.json", "nothere.distcp"])
def test_metadata_naming_storage_outside_its_folder_falls_back(tmp_path, capsys, name):
    """A `.metadata` built only from allowed classes, with a matching manifest, that names another step's file, an
    absolute path, the manifest or an unlisted name: nothing is read from it; the resume names the step and falls
    back to the newest intact one (step 2), saying so."""
    ck = tmp_path / "ck"
    opt, groups = _saved(ck, 2, 4)
    _forge_storage(ck / "step-00000004", name)
    notes = []
    assert checkpoint.check_dir(ck, resume=True, report=notes.append) == 2
    assert notes == [f"checkpoint step-00000004 is not one DCP may read (its .metadata names the storage file "
                     f"{name!r}, which is not a file of its own); nothing was read; resuming from step-00000002"]
    capsys.readouterr()
    assert checkpoint.load(ck, opt, groups) == 2
    assert capsys.readouterr().out == f"note: {notes[0]}\n"
    reader = checkpoint._VerifiedReader(str(ck / "step-00000004"))
    with pytest.raises(checkpoint.CheckpointError, match="is not one DCP may read"):
        reader.check_metadata()  # each rank's own check before DCP opens anything


def test_a_symlinked_file_or_step_folder_is_not_trusted(tmp_path):
    """A storage file replaced by a symbolic link (even to identical bytes) and a step folder that is a link to
    another step both fail, in one sentence each."""
    ck = tmp_path / "ck"
    _saved(ck, 2, 4)
    distcp = ck / "step-00000004" / "__0_0.distcp"
    copy = tmp_path / "copy.distcp"
    copy.write_bytes(distcp.read_bytes())
    distcp.unlink()
    distcp.symlink_to(copy)
    assert checkpoint.step_failure(ck / "step-00000004") == (
        "checkpoint step-00000004 fails its manifest (__0_0.distcp is a symbolic link)")
    (ck / "step-00000006").symlink_to(ck / "step-00000002")
    assert checkpoint.step_failure(ck / "step-00000006") == (
        "checkpoint step-00000006 is a symbolic link, not a folder of its own")
    assert checkpoint.resume_step(ck)[0] == 2


def test_saves_never_write_through_planted_links(tmp_path):
    """`latest.tmp` planted as a link to a file outside: the save refuses in one sentence and the file is
    unchanged; a stale regular `latest.tmp` is replaced; a `.partial` folder planted as a link to a folder
    outside is moved aside, never written into; `latest` as a link is replaced by a file, its target unchanged."""
    ck = tmp_path / "ck"
    opt, groups = _saved(ck, 2)
    outside = tmp_path / "outside.txt"
    outside.write_text("mine\n")
    (ck / "latest.tmp").symlink_to(outside)
    with pytest.raises(checkpoint.CheckpointError, match="latest.tmp' is a symbolic link"):
        checkpoint.save(ck, 4, opt, groups)
    assert outside.read_text() == "mine\n"
    (ck / "latest.tmp").unlink()
    (ck / "latest.tmp").write_text("stale")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (ck / "step-00000006.partial").symlink_to(elsewhere)
    (ck / "latest").unlink()
    (ck / "latest").symlink_to(outside)
    checkpoint.save(ck, 6, opt, groups)
    assert list(elsewhere.iterdir()) == [] and outside.read_text() == "mine\n"
    assert not (ck / "latest").is_symlink() and checkpoint.latest_step(ck) == 6
    assert (ck / "step-00000006.partial.incomplete").is_symlink()
    assert manifest.verify(ck / "step-00000006") is None


def test_a_failed_write_names_the_checkpoint_to_resume_from(tmp_path, monkeypatch):
    """A full disk while the manifest is written: one sentence naming the newest intact checkpoint."""
    import errno
    ck = tmp_path / "ck"
    opt, groups = _saved(ck, 2)

    def full(*_a, **_k):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    monkeypatch.setattr(manifest, "write", full)
    with pytest.raises(checkpoint.CheckpointError) as exc:
        checkpoint.save(ck, 4, opt, groups)
    assert str(exc.value) == (f"could not write checkpoint '{ck}/step-00000004' (No space left on device); "
                              f"resume from '{ck}/step-00000002' with --resume")


def test_latest_that_is_not_a_regular_file_is_refused(tmp_path):
    ck = tmp_path / "ck"
    ck.mkdir()
    os.mkfifo(ck / "latest")  # read, it would block forever
    with pytest.raises(checkpoint.CheckpointError, match="is not a regular file"):
        checkpoint.latest_step(ck)
