"""The multi-process test launcher retries a run only when its rendezvous connection broke, never on a failed
assertion (tests/runtime/dist_util.py)."""
import os

import pytest

from tests.runtime.dist_util import is_network_flake, run_workers


def _count_attempt(marker_dir: str) -> int:
    """How many runs have reached this point so far, this one included."""
    n = len(os.listdir(marker_dir)) + 1
    open(os.path.join(marker_dir, f"attempt{n}"), "w").close()
    return n


def flaky_then_fine(rank, world, marker_dir):
    import torch.distributed as dist
    if _count_attempt(marker_dir) == 1:
        raise dist.DistNetworkError("Connection reset by peer")
    return "done"


def writes_then_flakes_once(rank, world, marker_dir, out_dir):
    """Leaves a file in out_dir, then loses its rendezvous on the first run; returns what out_dir held at start."""
    import torch.distributed as dist
    found = sorted(os.listdir(out_dir))
    open(os.path.join(out_dir, "step-2"), "w").close()
    if _count_attempt(marker_dir) == 1:
        raise dist.DistNetworkError("Connection reset by peer")
    return found


def always_wrong(rank, world, marker_dir):
    _count_attempt(marker_dir)
    assert 1 + 1 == 3, "the code under test is wrong"


def test_a_broken_rendezvous_is_run_again(tmp_path):
    assert run_workers(flaky_then_fine, 1, str(tmp_path)) == "done"
    assert len(os.listdir(tmp_path)) == 2


def test_a_rerun_starts_with_its_output_folder_as_the_first_run_did(tmp_path):
    """What the broken run wrote into a fresh_dirs folder is gone before the rerun (a checkpoint it saved would be
    refused as already there); other folders are left as they are."""
    marker, out = tmp_path / "marker", tmp_path / "out"
    marker.mkdir()
    out.mkdir()
    assert run_workers(writes_then_flakes_once, 1, str(marker), str(out), fresh_dirs=(str(out),)) == []
    assert len(os.listdir(marker)) == 2 and os.listdir(out) == ["step-2"]


def test_a_failed_assertion_is_not_run_again(tmp_path):
    with pytest.raises(AssertionError, match="the code under test is wrong"):
        run_workers(always_wrong, 1, str(tmp_path))
    assert len(os.listdir(tmp_path)) == 1


def test_network_flake_words():
    assert is_network_flake("torch.distributed.DistNetworkError: Connection reset by peer")
    assert not is_network_flake("DistNetworkError ... AssertionError: losses differ")
    assert not is_network_flake("RuntimeError: shapes do not match")
