"""The one reader for every file a user hands us (plans, model configs, profiles, cluster files, runtime targets,
calibration CSVs): bounded before it is trusted, and every failure one sentence (an InputError, which
planner.errors.read_json turns into a PlanError).

A file is read only when it is a regular file (a FIFO would block forever, /dev/zero would be read until memory
runs out, a folder is no JSON): the kind is checked with os.stat before opening, and again on the opened
descriptor, which is opened non-blocking so that a FIFO swapped in between cannot hang the open. It is read up
to MAX_INPUT_BYTES. JSON is then parsed with integers of at most MAX_INT_DIGITS digits (Python's int() of a
4,000-digit string is slow, and a count beyond float range overflows later arithmetic) and nested at most
MAX_DEPTH levels (the decoder and every recursive walk of the result raise RecursionError on deeper nesting).
NaN and Infinity are parsed as floats, as Python's json module does: the field checks that follow name the
field that holds one. Standard library only (planner.errors imports this module), no torch.
"""
from __future__ import annotations

import json
import os
import stat


class InputError(ValueError):
    """A file a user handed us cannot be read as asked; the message is one sentence naming it."""


MAX_INPUT_BYTES = 64 << 20
"""64 MiB: the largest shipped profile is under 1 MiB; a file far larger is not one of ours."""
MAX_DEPTH = 64
"""Nesting levels of objects and arrays: the shipped files nest at most 9 deep."""
MAX_INT_DIGITS = 30
"""Digits of a JSON integer: the largest count the planner takes (MAX_GPUS etc.) has 8."""


class _Refused(ValueError):
    """A bound of this module was crossed while parsing; the message is the reason in a few words."""


def _describe_kind(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "is a folder, not a file"
    if stat.S_ISFIFO(mode):
        return "is not a regular file (it is a FIFO)"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "is not a regular file (it is a device)"
    if stat.S_ISSOCK(mode):
        return "is not a regular file (it is a socket)"
    return "is not a regular file"


def check_regular_file(path, what: str, missing: str | None = None) -> None:
    """`path` is an existing regular file (a symbolic link to one counts) of at most MAX_INPUT_BYTES; raises
    InputError naming `what` and the path otherwise (the sentence `missing` where it does not exist)."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise InputError(missing or f"{what} '{path}' does not exist") from None
    except OSError as exc:
        raise InputError(f"{what} '{path}' cannot be read ({exc.strerror or exc.__class__.__name__})") from None
    _check_stat(st, path, what)


def _check_stat(st: os.stat_result, path, what: str) -> None:
    if not stat.S_ISREG(st.st_mode):
        raise InputError(f"{what} '{path}' {_describe_kind(st.st_mode)}")
    if st.st_size > MAX_INPUT_BYTES:
        raise InputError(f"{what} '{path}' is {st.st_size / (1 << 20):.0f} MiB, more than the "
                        f"{MAX_INPUT_BYTES >> 20} MiB any input of ours needs")


def read_bytes(path, what: str, missing: str | None = None) -> bytes:
    """The content of the regular file `path` (see the module docstring), or an InputError naming `what` (the
    sentence `missing` where it does not exist)."""
    check_regular_file(path, what, missing)
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise InputError(missing or f"{what} '{path}' does not exist") from None
    except OSError as exc:
        raise InputError(f"{what} '{path}' cannot be read ({exc.strerror or exc.__class__.__name__})") from None
    try:
        _check_stat(os.fstat(fd), path, what)  # the file opened is the file checked
        chunks, total = [], 0
        while chunk := os.read(fd, 1 << 20):
            total += len(chunk)
            if total > MAX_INPUT_BYTES:  # grew since it was checked
                raise InputError(f"{what} '{path}' is more than the {MAX_INPUT_BYTES >> 20} MiB any input of "
                                "ours needs")
            chunks.append(chunk)
    except OSError as exc:
        raise InputError(f"{what} '{path}' cannot be read ({exc.strerror or exc.__class__.__name__})") from None
    finally:
        os.close(fd)
    return b"".join(chunks)


def _parse_int(text: str) -> int:
    digits = len(text.lstrip("-"))
    if digits > MAX_INT_DIGITS:
        raise _Refused(f"it holds an integer of {digits} digits, more than the {MAX_INT_DIGITS} any count needs")
    return int(text)


def _check_depth(value) -> None:
    """Raises _Refused when `value` nests more than MAX_DEPTH levels; walks with a stack, not recursion."""
    stack = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        children = node.values() if isinstance(node, dict) else node if isinstance(node, list) else ()
        for child in children:
            if isinstance(child, (dict, list)):
                if depth + 1 > MAX_DEPTH:
                    raise _Refused(f"it nests more than {MAX_DEPTH} levels deep")
                stack.append((child, depth + 1))


def parse(text: str | bytes, source: str):
    """`text` parsed as JSON within this module's bounds; `source` ("plan file 'p.json'", "line 3 of 'x.jsonl'")
    names it in the InputError raised for malformed or out-of-bounds JSON."""
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError:
            raise InputError(f"{source} is not readable JSON (UnicodeDecodeError)") from None
    try:
        value = json.loads(text, parse_int=_parse_int)
        _check_depth(value)
    except _Refused as exc:
        raise InputError(f"{source} is refused: {exc}") from None
    except RecursionError:
        raise InputError(f"{source} is refused: it nests more than {MAX_DEPTH} levels deep") from None
    except ValueError as exc:  # json.JSONDecodeError is a ValueError
        raise InputError(f"{source} is not readable JSON ({exc.__class__.__name__})") from None
    return value


def read_json(path, what: str, missing: str | None = None):
    """The JSON in the regular file `path`, or an InputError naming `what` ("plan file", "profile", ...) and the
    path: missing (the sentence `missing` where given), not a regular file, too large, not UTF-8 JSON, nested too
    deep or holding a huge integer."""
    return parse(read_bytes(path, what, missing), f"{what} '{path}'")
