"""Hugging Face checkpoints in and out of any plan: the tensor names of each model type (names.py), loading each
rank's slices from safetensors (load.py) and writing a checkpoint `transformers` reads (save.py)."""
from runtime.hf.checks import refuse_approximated_model_type
from runtime.hf.load import load_hf_weights
from runtime.hf.save import save_hf_weights

__all__ = ["load_hf_weights", "refuse_approximated_model_type", "save_hf_weights"]
