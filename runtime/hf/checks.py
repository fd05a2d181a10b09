"""What a Hugging Face checkpoint folder must be before any weight is read, each refusal one sentence (PlanError):
safetensors only (never a pickle), no file reached through a symlink out of the folder, no custom code, a header
that covers the whole file, and a config.json whose model is the plan's, field by field."""
from __future__ import annotations

import json
import struct
import warnings
from dataclasses import dataclass, fields
from pathlib import Path

from planner.errors import PlanError, read_json
from planner.hf_checks import APPROXIMATED_TYPES, refuse_approximated_model_type  # noqa: F401 (re-exported)
from planner.model import ModelSpec, from_hf_config
from runtime.hf.names import SUPPORTED_TYPES


PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")
FLOAT_DTYPES = ("F32", "F16", "BF16", "F64")
SPEC_FIELDS_NOT_COMPARED = ("name", "default_seq_len", "default_global_batch")
"""ModelSpec fields that are planning choices, not the model's architecture."""
UNUSED_TENSOR_SUFFIXES = ("rotary_emb.inv_freq", "attn.bias", "attn.masked_bias", "embeddings.position_ids",
                          "cls.predictions.decoder.bias")
"""Checkpoint tensors that are buffers or copies, not weights the runtime lacks: rotary tables, GPT-2's causal masks,
BERT's position ids and its decoder bias (the same tensor as cls.predictions.bias)."""
UNUSED_TENSOR_PREFIXES = ("bert.pooler.", "cls.seq_relationship.")
"""BERT's pooler and next-sentence head: pretraining heads the masked-LM model does not use (transformers'
BertForMaskedLM leaves them out too)."""
INDEX_NAME = "model.safetensors.index.json"
SINGLE_NAME = "model.safetensors"


@dataclass(frozen=True)
class CheckedFolder:
    """A checkpoint folder that passed every check: its config, model type and tensor locations."""
    root: Path
    config: dict
    model_type: str
    files: dict[str, Path]
    """Hugging Face tensor name -> the safetensors file holding it."""
    shapes: dict[str, tuple[int, ...]]


def _inside(root: Path, path: Path) -> Path:
    """path resolved, refused when it (or a symlink on the way) leads out of root."""
    real = path.resolve()
    if real != root and root not in real.parents:
        raise PlanError(f"'{path}' is a symlink out of the checkpoint folder '{root}', which parallel-plan does not "
                        "follow")
    return real


def _read_header(path: Path) -> dict:
    """The safetensors header of path, refused unless its tensors are floating point and cover the file exactly."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(8)
        n = struct.unpack("<Q", head)[0] if len(head) == 8 else -1
        raw = f.read(n) if 0 <= n <= size else b""
    try:
        header = json.loads(raw) if len(raw) == n else None
    except ValueError:
        header = None
    if not isinstance(header, dict):
        raise PlanError(f"safetensors file '{path}' is truncated or not safetensors (its header is unreadable)")
    header.pop("__metadata__", None)
    end = max((int(t["data_offsets"][1]) for t in header.values()), default=0)
    if 8 + n + end != size:
        raise PlanError(f"safetensors file '{path}' is truncated or padded: its header covers {8 + n + end} bytes, the "
                        f"file has {size}")
    odd = sorted({t["dtype"] for t in header.values()} - set(FLOAT_DTYPES))
    if odd:
        raise PlanError(f"safetensors file '{path}' holds tensors of dtype {odd[0]}, not floating-point weights")
    return header


def _weight_files(root: Path) -> dict[str, Path]:
    """Tensor name -> file: the index's weight_map, or every tensor of the single file."""
    index, single = root / INDEX_NAME, root / SINGLE_NAME
    if index.exists():
        index_data = read_json(_inside(root, index), "checkpoint index")
        weight_map = index_data.get("weight_map") if isinstance(index_data, dict) else None
        if not isinstance(weight_map, dict):
            raise PlanError(f"'{index}' has no weight_map object")
        return {k: _inside(root, root / v) for k, v in weight_map.items()}
    if single.exists():
        return {k: _inside(root, single) for k in _read_header(_inside(root, single))}
    if any(p.suffix in PICKLE_SUFFIXES for p in root.iterdir()):
        raise PlanError(f"checkpoint folder '{root}' holds only pickled weights (.bin/.pt), which parallel-plan never "
                        "loads because unpickling runs code; convert them to safetensors first")
    raise PlanError(f"checkpoint folder '{root}' holds no {SINGLE_NAME} or {INDEX_NAME}")


def _config(root: Path) -> dict:
    path = root / "config.json"
    if not path.exists():
        raise PlanError(f"checkpoint folder '{root}' has no config.json")
    cfg = read_json(_inside(root, path), "Hugging Face config")
    if not isinstance(cfg, dict):
        raise PlanError(f"'{path}' is not a JSON object")
    if cfg.get("auto_map"):
        raise PlanError(f"'{path}' names custom model code (auto_map), which parallel-plan never runs")
    if cfg.get("quantization_config"):
        raise PlanError(f"'{path}' describes quantized weights, which parallel-plan does not load")
    return cfg


def refuse_unused_tensors(folder: "CheckedFolder", used: set) -> None:
    """Refuse a checkpoint holding weights the runtime's model has no place for (a bias or a layer it does not
    build, such as Llama's mlp_bias), which loading would otherwise drop unseen."""
    for name in sorted(folder.shapes):
        if name in used or name.endswith(UNUSED_TENSOR_SUFFIXES) or name.startswith(UNUSED_TENSOR_PREFIXES):
            continue
        raise PlanError(f"checkpoint folder '{folder.root}' holds the tensor '{name}', which parallel-plan's model of "
                        "it does not have, so loading would drop it")


def compare_spec(spec: ModelSpec, config_path: Path) -> None:
    """Refuse, naming the first differing field, a config whose model is not `spec` (its GELU form and its model_type
    included; a plan's spec not read from a config, hf_model_type '', takes a config of any type)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        theirs = from_hf_config(config_path)
    for f in fields(ModelSpec):
        if f.name in SPEC_FIELDS_NOT_COMPARED or (f.name == "hf_model_type" and not spec.hf_model_type):
            continue
        a, b = getattr(spec, f.name), getattr(theirs, f.name)
        if a != b:
            raise PlanError(f"the checkpoint's config '{config_path}' does not match the plan's model: {f.name} is "
                            f"{b!r} there and {a!r} in the plan")


def check_folder(hf_dir, spec: ModelSpec) -> CheckedFolder:
    """Every check of the module's docstring, in order; reads headers and the config only, no weight."""
    root = Path(hf_dir)
    if not root.is_dir():
        raise PlanError(f"checkpoint folder '{hf_dir}' does not exist or is not a folder")
    root = root.resolve()
    cfg = _config(root)
    model_type = str(cfg.get("model_type", "")).lower()
    refuse_approximated_model_type(model_type)
    if model_type not in SUPPORTED_TYPES:
        raise PlanError(f"'{root / 'config.json'}' has model_type '{model_type}', whose weights parallel-plan does not "
                        f"map; it loads {', '.join(SUPPORTED_TYPES)}")
    compare_spec(spec, root / "config.json")
    files = _weight_files(root)
    shapes = {}
    for path in sorted(set(files.values())):
        for name, t in _read_header(path).items():
            shapes[name] = tuple(t["shape"])
    missing = sorted(n for n in files if n not in shapes)
    if missing:
        raise PlanError(f"the index of '{root}' names tensor '{missing[0]}', which its file does not hold")
    return CheckedFolder(root, cfg, model_type, files, shapes)


def refuse_shared_kv_layout(spec: ModelSpec, tp: int) -> None:
    """Refuse Hugging Face weights in or out of a layout whose TP degree exceeds the KV heads: its K/V projections
    are replicated per group of ranks (runtime/parallel/tensor.py SharedKVQKVLinear), which the name map does not
    cover yet."""
    if spec.num_kv_heads < tp:
        raise PlanError(f"Hugging Face weights are not loaded or saved under TP {tp} with {spec.num_kv_heads} KV "
                        f"head(s) yet (the K/V heads are replicated across TP ranks there); use TP <= "
                        f"{spec.num_kv_heads}")


def check_launch_folders(spec: ModelSpec, init_from, save_hf, hf_config, save_every: int, tp: int = 1) -> None:
    """`plan launch`'s checks of its Hugging Face flags, before any worker starts: the --init-from folder passes
    check_folder; --save-hf has a config to write (--hf-config, else --init-from's) that matches the plan's model,
    names a type whose weights are mapped, and neither it nor a step folder it would write exists yet."""
    if init_from or save_hf:
        refuse_shared_kv_layout(spec, tp)
    if init_from:
        check_folder(init_from, spec)
    if not save_hf:
        if hf_config:
            raise PlanError("--hf-config is the config --save-hf writes; give --save-hf too")
        return
    config = Path(hf_config) if hf_config else (Path(init_from) / "config.json" if init_from else None)
    if config is None:
        raise PlanError("--save-hf needs the model's Hugging Face config.json: give --init-from or --hf-config")
    if not config.is_file():
        raise PlanError(f"--save-hf's config '{config}' does not exist or is not a file")
    cfg = read_json(config, "Hugging Face config")
    model_type = str(cfg.get("model_type", "")).lower() if isinstance(cfg, dict) else ""
    refuse_approximated_model_type(model_type)
    if model_type not in SUPPORTED_TYPES:
        raise PlanError(f"--save-hf's config '{config}' has model_type '{model_type}', whose weights parallel-plan "
                        f"does not map; it writes {', '.join(SUPPORTED_TYPES)}")
    compare_spec(spec, config)
    out = Path(save_hf)
    taken = [out] if out.exists() or out.is_symlink() else []
    if save_every:
        taken += sorted(p for p in out.parent.glob(out.name + "-step*") if p.exists() or p.is_symlink())
    if taken:
        raise PlanError(f"--save-hf's folder '{taken[0]}' exists already; parallel-plan never overwrites a checkpoint")
