"""Training data: synthetic tokens, flat token files, Megatron indexed datasets, blends; GPT and MLM batches.

Every batch is a pure function of (step, sequence index), so a resumed run, or a run under another
layout, sees exactly the same global batch: step s uses global sequences [s*GB, (s+1)*GB); data-parallel
rank r takes the contiguous block r of GB/dp of them, split into micro-batches. Context-parallel ranks
take two mirrored chunks of each sequence (load balance for causal masks; see `cp_split`).

Sources (all validated when opened, before any GPU work; errors are one sentence, DataError):
  synthetic                    uniform random tokens
  PATH (flat)                  a raw array of uint16 or uint32 tokens (dtype from --data-dtype, or the
                               suffix .u16/.uint16/.u32/.uint32, else uint16 when the vocabulary fits; a
                               file that looks like uint32 read as uint16 is refused, see `_refuse_likely_uint32`)
  PREFIX (PREFIX.bin + .idx)   Megatron's MMIDIDX indexed dataset (integer token dtypes only); documents are
                               read as one stream
  W1:SRC1,W2:SRC2              a blend; each sequence is drawn from one source with probability ~ weight

Token ids: every token of every file is checked to lie in [0, vocab) when the file is opened (`_check_ids`),
so an out-of-range id never reaches the model (at TP1 it would fail inside the embedding, at TP>1 the
vocab-parallel embedding would zero it without a word). `plan launch` opens the sources before torchrun, and each
worker opens them again before any GPU work; a worker scans only a file that is not, by path, size and
modification time, one the launcher already scanned (`scanned_files_env`), so a file replaced in between is
checked too and an unchanged one is not read once per worker.
"""
from __future__ import annotations

import math
import os
import queue
import struct
import threading
import time
from pathlib import Path

import numpy as np
import torch

from planner.errors import PlanError
from planner.model.families import family_of
from runtime.model import IGNORE_INDEX


class DataError(PlanError):
    """A data source that cannot be used; one sentence."""


_MMIDIDX_MAGIC = b"MMIDIDX\x00\x00"
_MMIDIDX_DTYPES = {1: np.uint8, 2: np.int8, 3: np.int16, 4: np.int32, 5: np.int64, 8: np.uint16}
_MMIDIDX_FLOAT_CODES = {6: "float64", 7: "float32"}  # in Megatron's table, but tokens are integers


class Synthetic:
    def __init__(self, vocab: int, seed: int = 0):
        self.vocab, self.seed, self.name = vocab, seed, "synthetic"

    def sequence(self, index: int, length: int) -> np.ndarray:
        rng = np.random.default_rng([self.seed, index])
        return rng.integers(0, self.vocab, size=length, dtype=np.int64)


class TokenStream:
    """A memory-mapped token array; sequence i is the window starting at i*(length-1) (wrapping around)."""

    def __init__(self, tokens: np.ndarray, name: str):
        self.tokens, self.name = tokens, name

    def sequence(self, index: int, length: int) -> np.ndarray:
        n = len(self.tokens)
        windows = max(1, (n - length) // (length - 1) + 1)
        start = (index % windows) * (length - 1)
        return np.asarray(self.tokens[start:start + length], dtype=np.int64)


_SCAN_CHUNK = 1 << 22  # tokens per numpy call of the id scan: cache-sized, and it stops at the first bad chunk


def _check_tokens(tokens: np.ndarray, name: str, vocab: int, length: int) -> None:
    if len(tokens) < length:
        raise DataError(f"data file '{name}' holds {len(tokens)} tokens, fewer than one sequence of {length}")
    _check_ids(tokens, name, vocab)


SCANNED_FILES_ENV = "PLAN_DATA_SCANNED"
"""Newline-separated stamps (_scan_stamp) of the files whose ids the launcher scanned, for its workers."""
_scanned: set[str] = set()


def _scan_stamp(name: str, vocab: int) -> str:
    st = os.stat(name)
    return f"{os.path.abspath(name)}|{st.st_size}|{st.st_mtime_ns}|{vocab}"


def scanned_files_env() -> dict:
    """The environment entry that spares the workers a second scan of the files this process scanned."""
    return {SCANNED_FILES_ENV: "\n".join(sorted(_scanned))} if _scanned else {}


def _check_ids(tokens: np.ndarray, name: str, vocab: int) -> None:
    """Every token in [0, vocab): a chunked scan of the whole file (max only for unsigned dtypes), skipped
    when the dtype cannot hold an id outside the vocabulary, or when the launcher scanned this very file
    (SCANNED_FILES_ENV). A 1 GB file takes 0.13 s from the page cache (0.25 s for int32, which
    needs the min too), 0.5-1.6 s read cold from disk."""
    info = np.iinfo(tokens.dtype)
    if info.min >= 0 and info.max < vocab:
        return
    stamp = _scan_stamp(name, vocab)
    if stamp in _scanned or stamp in os.environ.get(SCANNED_FILES_ENV, "").split("\n"):
        return
    signed = info.min < 0
    for start in range(0, len(tokens), _SCAN_CHUNK):
        chunk = tokens[start:start + _SCAN_CHUNK]
        if int(chunk.max()) >= vocab or (signed and int(chunk.min()) < 0):
            _raise_bad_id(chunk, start, name, vocab)
    _scanned.add(stamp)


def _raise_bad_id(chunk: np.ndarray, start: int, name: str, vocab: int) -> None:
    at = int(np.flatnonzero((chunk < 0) | (chunk >= vocab))[0])
    raise DataError(f"data file '{name}' has token id {int(chunk[at])} at token {start + at}, outside the model's "
                    f"vocabulary of {vocab} (ids 0..{vocab - 1})")


def _refuse_likely_uint32(words: np.ndarray, path: Path) -> None:
    """A uint32 file of ids below 65536, read as uint16, gives id, 0, id, 0, ...: refuse it when every second
    uint16 word of a sample is zero and the others are not (real uint16 text essentially never does this)."""
    sample = np.asarray(words[: min(len(words), 1 << 20) // 2 * 2]).reshape(-1, 2)
    if len(sample) >= 2 and not sample[:, 1].any() and sample[:, 0].any():
        raise DataError(f"data file '{path}' looks like uint32 tokens (every second uint16 word is zero); name "
                        f"its dtype with --data-dtype uint32 (or uint16) or the suffix .u32 (or .u16)")


_FLAT_SUFFIX_DTYPES = {".u16": "uint16", ".uint16": "uint16", ".u32": "uint32", ".uint32": "uint32"}


def open_flat(path: Path, vocab: int, length: int, dtype: str | None = None) -> TokenStream:
    guessed = dtype is None and path.suffix.lower() not in _FLAT_SUFFIX_DTYPES
    if dtype is None:
        dtype = _FLAT_SUFFIX_DTYPES.get(path.suffix.lower(), "uint16" if vocab <= 65536 else "uint32")
    if dtype not in ("uint16", "uint32"):
        raise DataError(f"token dtype '{dtype}' is not uint16 or uint32")
    if dtype == "uint16" and vocab > 65536:
        raise DataError(f"data file '{path}' is read as uint16 but the vocabulary of {vocab} needs uint32")
    size = path.stat().st_size
    item = np.dtype(dtype).itemsize
    if size % item:
        raise DataError(f"data file '{path}' is {size} bytes, not a whole number of {dtype} tokens")
    if size == 0:
        raise DataError(f"data file '{path}' is empty")
    tokens = np.memmap(path, dtype=dtype, mode="r")
    if guessed and dtype == "uint16" and size % 4 == 0:
        _refuse_likely_uint32(tokens, path)
    _check_tokens(tokens, str(path), vocab, length)
    return TokenStream(tokens, str(path))


def read_mmidx(idx_path: Path):
    """Parse a Megatron MMIDIDX index: (token dtype, sizes int32[n], pointers int64[n], doc_idx int64[d])."""
    data = idx_path.read_bytes()
    if len(data) < 34 or data[:9] != _MMIDIDX_MAGIC:
        raise DataError(f"'{idx_path}' is not a Megatron indexed dataset index (bad MMIDIDX header)")
    (version,) = struct.unpack("<Q", data[9:17])
    if version != 1:
        raise DataError(f"'{idx_path}' has index version {version}; only version 1 is supported")
    code = data[17]
    if code in _MMIDIDX_FLOAT_CODES:
        raise DataError(f"'{idx_path}' names token dtype code {code} ({_MMIDIDX_FLOAT_CODES[code]}), but tokens "
                        f"must be integers")
    if code not in _MMIDIDX_DTYPES:
        raise DataError(f"'{idx_path}' names an unknown token dtype code {code}")
    n_seq, n_doc = struct.unpack("<QQ", data[18:34])
    need = 34 + n_seq * 4 + n_seq * 8 + n_doc * 8
    if len(data) < need:
        raise DataError(f"'{idx_path}' is truncated ({len(data)} bytes, its header promises {need})")
    sizes = np.frombuffer(data, dtype=np.int32, count=n_seq, offset=34)
    pointers = np.frombuffer(data, dtype=np.int64, count=n_seq, offset=34 + 4 * n_seq)
    doc_idx = np.frombuffer(data, dtype=np.int64, count=n_doc, offset=34 + 12 * n_seq)
    return _MMIDIDX_DTYPES[code], sizes, pointers, doc_idx


def open_indexed(prefix: Path, vocab: int, length: int) -> TokenStream:
    idx, bin_ = Path(str(prefix) + ".idx"), Path(str(prefix) + ".bin")
    for p in (idx, bin_):
        if not p.exists():
            raise DataError(f"indexed dataset '{prefix}' lacks its file '{p}'")
        if not p.is_file():
            raise DataError(f"indexed dataset '{prefix}' has '{p}', which is not a regular file")
    dtype, sizes, pointers, _ = read_mmidx(idx)
    if len(sizes) == 0:
        raise DataError(f"indexed dataset '{prefix}' holds no sequences (its index '{idx}' is empty)")
    item = np.dtype(dtype).itemsize
    expected = int(pointers[-1]) + int(sizes[-1]) * item
    if expected <= 0:  # np.memmap cannot map zero tokens
        raise DataError(f"indexed dataset '{prefix}' holds no tokens (its index describes {expected} bytes)")
    actual = bin_.stat().st_size
    if actual < expected:
        raise DataError(f"'{bin_}' is {actual} bytes but its index describes {expected}: the file is truncated")
    if int(pointers[0]) != 0:
        raise DataError(f"'{idx}' does not start its first document at offset 0")
    tokens = np.memmap(bin_, dtype=dtype, mode="r", shape=(expected // item,))
    _check_tokens(tokens, str(bin_), vocab, length)
    return TokenStream(tokens, str(prefix))


class Blend:
    def __init__(self, sources, weights, seed: int = 0):
        w = np.asarray(weights, dtype=np.float64)
        if len(w) == 0 or (w <= 0).any():
            raise DataError("blend weights must be positive numbers")
        self.sources, self.cum, self.seed = sources, np.cumsum(w / w.sum()), seed
        self.name = "+".join(s.name for s in sources)

    def sequence(self, index: int, length: int) -> np.ndarray:
        u = np.random.default_rng([self.seed, 7, index]).random()
        k = min(int(np.searchsorted(self.cum, u, side="right")), len(self.sources) - 1)
        return self.sources[k].sequence(index, length)


def open_source(spec_str: str | None, vocab: int, seq_len: int, dtype: str | None = None, seed: int = 0):
    """Parse --data. Raises DataError with one sentence for anything unusable."""
    length = seq_len + 1
    if not spec_str or spec_str == "synthetic":
        return Synthetic(vocab, seed)
    items = [s for s in spec_str.split(",") if s]
    sources, weights = [], []
    for item in items:
        weight, path = 1.0, item
        if ":" in item:
            head, tail = item.split(":", 1)
            try:
                weight, path = float(head), tail
            except ValueError:
                weight, path = 1.0, item
        p = Path(path)
        if p.suffix in (".bin", ".idx") and Path(str(p.with_suffix("")) + ".idx").exists():
            src = open_indexed(p.with_suffix(""), vocab, length)
        elif Path(path + ".idx").exists() or Path(path + ".bin").exists():
            src = open_indexed(p, vocab, length)
        elif p.is_file():
            src = open_flat(p, vocab, length, dtype)
        elif p.is_dir():
            raise DataError(f"data source '{path}' is a folder; --data takes a flat token file, the prefix of a "
                            "Megatron .bin/.idx pair (PATH for PATH.bin and PATH.idx), 'synthetic', or W1:SRC1,W2:SRC2")
        elif p.exists():  # a FIFO or a device: not a file of tokens, and reading it might never end
            raise DataError(f"data source '{path}' is not a regular file")
        else:
            raise DataError(f"data source '{path}' does not exist")
        if not (math.isfinite(weight) and weight >= 0):
            raise DataError(f"data source '{item}' has the weight {weight}; a blend weight is a finite number >= 0")
        sources.append(src)
        weights.append(weight)
    return sources[0] if len(sources) == 1 and weights[0] > 0 else Blend(sources, weights, seed)


# -- batches ---------------------------------------------------------------------------------------

def mask_for_mlm(tokens: np.ndarray, vocab: int, index: int, seed: int, mask_id: int | None = None):
    """Masked-LM masking (BERT's): 15% of positions are predicted; of those 80% [MASK], 10% random, 10% unchanged."""
    rng = np.random.default_rng([seed, 11, index])
    mask_id = (103 if vocab > 103 else vocab - 1) if mask_id is None else mask_id
    chosen = rng.random(tokens.shape) < 0.15
    labels = np.where(chosen, tokens, IGNORE_INDEX)
    roll = rng.random(tokens.shape)
    out = tokens.copy()
    out[chosen & (roll < 0.8)] = mask_id
    rand = chosen & (roll >= 0.8) & (roll < 0.9)
    out[rand] = rng.integers(0, vocab, size=int(rand.sum()))
    return out, labels


def make_sequence(source, family: str, vocab: int, seq_len: int, index: int, seed: int = 0) -> dict:
    """Sequence `index` of `source` as one training example of the family's objective (ModelFamily.objective):
    next-token labels for a causal LM, masked positions (mask_for_mlm) for a masked LM; with token types (BERT's
    segments) the first half of the sequence is type 0, the second type 1.

    Args:
        family: the model's family name (ModelSpec.family).
    Returns:
        {tokens, labels[, token_types]}: int64 arrays of seq_len."""
    fam = family_of(family)
    seq = source.sequence(index, seq_len + 1)
    if fam.masked_lm:
        tokens, labels = mask_for_mlm(seq[:seq_len], vocab, index, seed)
    else:
        tokens, labels = seq[:-1], seq[1:]
    out = dict(tokens=tokens, labels=labels)
    if fam.token_types:
        out["token_types"] = (np.arange(seq_len) >= seq_len // 2).astype(np.int64)
    return out


def cp_split(x: torch.Tensor, cp: int, cp_rank: int, dim: int = -1) -> torch.Tensor:
    """The context-parallel rank's part of a sequence: chunks cp_rank and 2*cp-1-cp_rank of 2*cp."""
    if cp == 1:
        return x
    chunks = x.chunk(2 * cp, dim=dim)
    return torch.cat([chunks[cp_rank], chunks[2 * cp - 1 - cp_rank]], dim=dim)


def step_micro_batches(source, family, vocab, seq_len, global_batch, micro_batch, dp, dp_rank, step,
                       cp=1, cp_rank=0, seed=0) -> list[dict]:
    """This rank's micro-batches of global step `step` (CPU tensors)."""
    per = global_batch // dp
    first = step * global_batch + dp_rank * per
    out = []
    for i in range(0, per, micro_batch):
        seqs = [make_sequence(source, family, vocab, seq_len, first + i + j, seed) for j in range(micro_batch)]
        mb = {k: torch.from_numpy(np.stack([s[k] for s in seqs])) for k in seqs[0]}
        if cp > 1:
            mb = {k: cp_split(v, cp, cp_rank) for k, v in mb.items()}
            mb["positions"] = cp_split(torch.arange(seq_len), cp, cp_rank)
        out.append(mb)
    return out


class Prefetcher:
    """Prepares the next steps' micro-batches in a background thread; `next()` returns them on the
    device and the seconds the training loop waited for them."""

    def __init__(self, make_step, start_step: int, device, depth: int = 2):
        self.make_step, self.device = make_step, torch.device(device)
        self.q: queue.Queue = queue.Queue(maxsize=depth)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, args=(start_step,), daemon=True)
        self.thread.start()

    def _run(self, step):
        while not self.stop.is_set():
            try:
                mbs = self.make_step(step)
                if self.device.type == "cuda":
                    mbs = [{k: v.pin_memory() for k, v in mb.items()} for mb in mbs]
            except Exception as exc:  # surfaced in next()
                self.q.put(exc)
                return
            while not self.stop.is_set():
                try:
                    self.q.put(mbs, timeout=0.1)
                    break
                except queue.Full:
                    continue
            step += 1

    def next(self):
        t = time.perf_counter()
        item = self.q.get()
        if isinstance(item, Exception):
            raise item
        mbs = [{k: v.to(self.device, non_blocking=True) for k, v in mb.items()} for mb in item]
        return mbs, time.perf_counter() - t

    def close(self):
        # join: a daemon thread still inside a torch op when the interpreter shuts down aborts the process
        # ("terminate called without an active exception")
        self.stop.set()
        self.thread.join(timeout=30)
