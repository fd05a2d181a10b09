"""runtime/bias_grad.py: the column sums against float64 sums, on PyTorch's path, under Triton's interpreter (a
worker process with TRITON_INTERPRET=1) and on CUDA; shapes that leave partial tiles and one-slab cases."""
import importlib.util

import pytest
import torch

from runtime.bias_grad import _slabs, bias_grad

SHAPES = [(37, 80), (3, 1500), (130, 129), (1, 7), (4, 9, 24)]


def _check(device: str, dtype) -> list[str]:
    bad = []
    for shape in SHAPES:
        torch.manual_seed(0)
        x = (3 * torch.randn(*shape)).to(dtype).to(device)
        got = bias_grad(x)
        want = x.detach().cpu().double().reshape(-1, shape[-1]).sum(0)
        tol = 1e-4 if dtype == torch.float32 else 2e-2 * max(1.0, float(want.abs().max()))
        if got.shape != (shape[-1],) or got.dtype != dtype:
            bad.append(f"{shape}: got {tuple(got.shape)} {got.dtype}")
        elif not torch.allclose(got.cpu().double(), want, rtol=1e-2 if dtype != torch.float32 else 1e-5, atol=tol):
            bad.append(f"{shape} {dtype}: max error {(got.cpu().double() - want).abs().max():.3g}")
    return bad


def test_slabs_cover_every_row_once():
    for rows, cols in [(8192, 2048), (8192, 8192), (37, 80), (1, 7), (100_000, 128)]:
        n, per = _slabs(rows, cols)
        assert per % 64 == 0 and n * per >= rows > (n - 1) * per


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_pytorch_path_sums_columns(dtype):
    assert _check("cpu", dtype) == []


def _interpreted(rank, world):
    from runtime.triton_support import use_triton
    assert use_triton(torch.device("cpu"))
    return _check("cpu", torch.float32)


def test_triton_column_sums_interpreted(monkeypatch):
    if importlib.util.find_spec("triton") is None:
        pytest.skip("Triton is not installed")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    from tests.runtime.dist_util import run_workers
    assert run_workers(_interpreted, 1) == []


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_triton_column_sums_on_cuda(dtype):
    assert _check("cuda", dtype) == []
