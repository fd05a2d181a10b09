"""Data sources: flat files, Megatron indexed datasets, blends, MLM masking, and one-sentence errors."""
import struct

import numpy as np
import pytest
import torch

from runtime.data import (DataError, Prefetcher, cp_split, mask_for_mlm, open_source, read_mmidx,
                          step_micro_batches)


def write_mmidx(prefix, docs, dtype=np.uint16, code=8):
    sizes = np.array([len(d) for d in docs], dtype=np.int32)
    item = np.dtype(dtype).itemsize
    pointers = np.concatenate([[0], np.cumsum(sizes[:-1]) * item]).astype(np.int64)
    with open(f"{prefix}.bin", "wb") as f:
        for d in docs:
            f.write(np.asarray(d, dtype=dtype).tobytes())
    with open(f"{prefix}.idx", "wb") as f:
        f.write(b"MMIDIDX\x00\x00" + struct.pack("<Q", 1) + bytes([code]) + struct.pack("<QQ", len(docs), len(docs) + 1))
        f.write(sizes.tobytes() + pointers.tobytes() + np.arange(len(docs) + 1, dtype=np.int64).tobytes())


def test_flat_file_windows(tmp_path):
    p = tmp_path / "tok.u16"
    np.arange(1000, dtype=np.uint16).__mod__(256).astype(np.uint16).tofile(p)
    src = open_source(str(p), vocab=256, seq_len=16)
    s0, s1 = src.sequence(0, 17), src.sequence(1, 17)
    assert list(s0) == list(range(17)) and s1[0] == 16  # windows overlap by one token (next-token labels)


def test_indexed_dataset_and_blend(tmp_path):
    write_mmidx(tmp_path / "a", [[1, 2, 3] * 20, [4, 5] * 30])
    dtype, sizes, pointers, doc_idx = read_mmidx(tmp_path / "a.idx")
    assert dtype == np.uint16 and list(sizes) == [60, 60] and list(pointers) == [0, 120]
    np.full(500, 7, dtype=np.uint16).tofile(tmp_path / "b.u16")
    src = open_source(f"0.5:{tmp_path / 'a'},0.5:{tmp_path / 'b.u16'}", vocab=256, seq_len=16)
    seqs = [src.sequence(i, 17) for i in range(40)]
    from_b = sum(1 for s in seqs if (s == 7).all())
    assert 8 < from_b < 32


@pytest.mark.parametrize("make,needle", [
    (lambda d: (d / "odd.bin").write_bytes(b"\x01\x00\x02"), "not a whole number"),
    (lambda d: np.arange(5, dtype=np.uint16).tofile(d / "short.u16"), "fewer than one sequence"),
    (lambda d: np.full(100, 999, dtype=np.uint16).tofile(d / "big.u16"), "outside the model's vocabulary"),
    (lambda d: [(d / "bad.idx").write_bytes(b"NOTMMIDX" * 8), (d / "bad.bin").write_bytes(b"\x00" * 64)],
     "bad MMIDIDX header"),
])
def test_bad_files_get_one_sentence(tmp_path, make, needle):
    make(tmp_path)
    name = next(p for p in tmp_path.iterdir())
    target = str(name.with_suffix("")) if name.suffix in (".idx",) or (tmp_path / "bad.idx").exists() else str(name)
    with pytest.raises(DataError) as exc:
        open_source(target, vocab=256, seq_len=16)
    msg = str(exc.value)
    assert needle in msg and "\n" not in msg


def test_truncated_bin_and_missing(tmp_path):
    write_mmidx(tmp_path / "t", [list(range(50)), list(range(50))])
    with open(tmp_path / "t.bin", "r+b") as f:
        f.truncate(100)
    with pytest.raises(DataError, match="truncated"):
        open_source(str(tmp_path / "t"), vocab=256, seq_len=16)
    with pytest.raises(DataError, match="does not exist"):
        open_source(str(tmp_path / "nope.bin"), vocab=256, seq_len=16)


def test_mlm_masking_proportions():
    tokens = np.random.default_rng(0).integers(200, 256, size=20000)
    out, labels = mask_for_mlm(tokens, 30522, 0, 0)
    chosen = labels != -100
    assert 0.14 < chosen.mean() < 0.16
    assert 0.77 < (out[chosen] == 103).mean() < 0.83
    assert (labels[chosen] == tokens[chosen]).all() and (out[~chosen] == tokens[~chosen]).all()


def test_batches_are_a_function_of_the_step_and_cp_split():
    src = open_source("synthetic", 256, 16)
    whole = step_micro_batches(src, "gpt", 256, 16, 8, 4, 1, 0, step=3)
    halves = [step_micro_batches(src, "gpt", 256, 16, 8, 2, 2, r, step=3) for r in range(2)]
    joined = torch.cat([mb["tokens"] for h in halves for mb in h])
    assert torch.equal(joined, torch.cat([mb["tokens"] for mb in whole]))
    x = torch.arange(8)
    assert cp_split(x, 2, 0).tolist() == [0, 1, 6, 7] and cp_split(x, 2, 1).tolist() == [2, 3, 4, 5]
    pf = Prefetcher(lambda s: step_micro_batches(src, "bert", 256, 16, 4, 2, 1, 0, s), 0, "cpu")
    mbs, wait = pf.next()
    pf.close()
    assert set(mbs[0]) == {"tokens", "labels", "token_types"} and wait >= 0


def one_sentence(exc_info) -> str:
    msg = str(exc_info.value)
    assert "\n" not in msg
    return msg


@pytest.mark.parametrize("dtype,code,bad", [(np.int32, 4, -1), (np.int16, 3, -7), (np.int64, 5, 256),
                                            (np.uint16, 8, 300)])
def test_indexed_ids_outside_the_vocabulary_are_refused(tmp_path, dtype, code, bad):
    write_mmidx(tmp_path / "d", [[1, 2, 3] * 20, [4, 5, bad] * 20], dtype=dtype, code=code)
    with pytest.raises(DataError) as exc:
        open_source(str(tmp_path / "d"), vocab=256, seq_len=16)
    msg = one_sentence(exc)
    assert f"'{tmp_path / 'd.bin'}'" in msg and f"token id {bad} at token 62" in msg and "vocabulary of 256" in msg


def test_every_token_is_checked_not_only_the_first_chunk(tmp_path, monkeypatch):
    n = (1 << 20) + 100  # past the old 2^20-token sample, with the real chunk size
    tokens = np.full(n, 5, dtype=np.uint16)
    tokens[-1] = 256
    tokens.tofile(tmp_path / "long.u16")
    with pytest.raises(DataError, match=f"token id 256 at token {n - 1},"):
        open_source(str(tmp_path / "long.u16"), vocab=256, seq_len=16)
    import runtime.data
    monkeypatch.setattr(runtime.data, "_SCAN_CHUNK", 64)  # a bad id in a later chunk, reported at its position
    write_mmidx(tmp_path / "neg", [[3] * 1000, [3] * 10 + [-1]], dtype=np.int32, code=4)
    with pytest.raises(DataError, match="token id -1 at token 1010,"):
        open_source(str(tmp_path / "neg"), vocab=256, seq_len=16)


def test_ids_up_to_the_last_of_the_vocabulary_pass(tmp_path):
    write_mmidx(tmp_path / "i", [[0, 255] * 20], dtype=np.int32, code=4)
    assert open_source(str(tmp_path / "i"), vocab=256, seq_len=16).sequence(0, 17).max() == 255
    write_mmidx(tmp_path / "u8", [[255] * 40], dtype=np.uint8, code=1)  # dtype fits the vocabulary: no scan
    assert open_source(str(tmp_path / "u8"), vocab=256, seq_len=16).sequence(0, 17).max() == 255


@pytest.mark.parametrize("docs,needle", [([], "holds no sequences"), ([[]], "holds no tokens")])
def test_empty_indexed_dataset_gets_one_sentence(tmp_path, docs, needle):
    write_mmidx(tmp_path / "e", docs, dtype=np.int32, code=4)
    with pytest.raises(DataError) as exc:
        open_source(str(tmp_path / "e"), vocab=256, seq_len=16)
    assert needle in one_sentence(exc)


@pytest.mark.parametrize("dtype,code", [(np.float64, 6), (np.float32, 7)])
def test_float_token_dtypes_are_refused(tmp_path, dtype, code):
    write_mmidx(tmp_path / "f", [[1, 2, 3] * 20], dtype=dtype, code=code)
    with pytest.raises(DataError) as exc:
        open_source(str(tmp_path / "f"), vocab=256, seq_len=16)
    assert f"dtype code {code} ({np.dtype(dtype).name})" in one_sentence(exc) and "integers" in str(exc.value)


def test_uint32_flat_file_without_a_suffix_is_not_read_as_uint16(tmp_path):
    p = tmp_path / "tokens.bin"
    (np.arange(1000, dtype=np.uint32) % 200 + 1).tofile(p)
    with pytest.raises(DataError) as exc:
        open_source(str(p), vocab=256, seq_len=16)
    assert "looks like uint32" in one_sentence(exc) and "--data-dtype uint32" in str(exc.value)
    assert list(open_source(str(p), 256, 16, dtype="uint32").sequence(0, 17)[:4]) == [1, 2, 3, 4]
    p.rename(tmp_path / "tokens.u32")
    assert list(open_source(str(tmp_path / "tokens.u32"), 256, 16).sequence(0, 17)[:4]) == [1, 2, 3, 4]


def test_uint16_flat_files_still_work_without_a_suffix(tmp_path):
    p = tmp_path / "tokens.bin"
    np.random.default_rng(0).integers(0, 256, size=1000, dtype=np.uint16).tofile(p)
    assert open_source(str(p), vocab=256, seq_len=16).sequence(0, 17).max() < 256
    pairs = np.zeros(1000, dtype=np.uint16)
    pairs[::2] = 9  # looks like uint32, but the user said uint16
    pairs.tofile(p)
    assert list(open_source(str(p), 256, 16, dtype="uint16").sequence(0, 17)[:4]) == [9, 0, 9, 0]
    pairs.tofile(tmp_path / "pairs.u16")
    assert list(open_source(str(tmp_path / "pairs.u16"), 256, 16).sequence(0, 17)[:4]) == [9, 0, 9, 0]


def test_a_file_scanned_by_the_launcher_is_not_scanned_again_by_its_workers(tmp_path, monkeypatch):
    """The launcher passes the stamps (path, size, modification time, vocabulary) of the files it scanned to its
    workers, which skip those; a file changed since is scanned again, and its bad id still found."""
    import os
    import runtime.data as data
    from runtime.launch import worker_env
    monkeypatch.setattr(data, "_scanned", set())
    good = np.full(64, 7, dtype=np.int32)
    write_mmidx(tmp_path / "d", [good], dtype=np.int32, code=4)
    open_source(str(tmp_path / "d"), vocab=256, seq_len=16)
    env = worker_env("cpu")
    assert str(tmp_path / "d.bin") in env[data.SCANNED_FILES_ENV]
    scans = []
    monkeypatch.setattr(data, "_raise_bad_id", lambda *a: scans.append(a))
    monkeypatch.setattr(data, "_scanned", set())  # a worker: a new process with the launcher's environment
    monkeypatch.setenv(data.SCANNED_FILES_ENV, env[data.SCANNED_FILES_ENV])
    bad = good.copy()
    bad[3] = 999
    with open(tmp_path / "d.bin", "r+b") as f:  # same size, same mtime: taken as scanned
        st = os.stat(tmp_path / "d.bin")
        f.write(bad.tobytes())
    os.utime(tmp_path / "d.bin", ns=(st.st_atime_ns, st.st_mtime_ns))
    open_source(str(tmp_path / "d"), vocab=256, seq_len=16)
    assert scans == []
    os.utime(tmp_path / "d.bin", ns=(st.st_atime_ns, st.st_mtime_ns + 1))  # changed since: scanned again
    open_source(str(tmp_path / "d"), vocab=256, seq_len=16)
    assert len(scans) == 1
