"""Export a torch actor to ONNX with its spec, and check onnxruntime agrees with torch.

The model takes one float32 input `obs` of shape (1, obs_dim) (the agent feeds a batch of
one) and returns `action` (1, n), already clipped to [-1, 1] as the trainer's environments
clip it. `verify` runs both on stored inputs; a difference above `tol` is a PolicyError.
"""

from __future__ import annotations

import io
import warnings
from typing import Any

import numpy as np
from numpy.typing import NDArray

from policies.errors import PolicyError
from policies.policy import ort_session

OPSET = 17


def to_onnx(module: Any, obs_dim: int) -> bytes:
    """ONNX bytes of torch `module` (obs (1, obs_dim) -> action (1, n))."""
    import torch

    module = module.eval()
    buf = io.BytesIO()
    with warnings.catch_warnings():  # the TorchScript exporter needs no onnxscript
        warnings.simplefilter("ignore")
        torch.onnx.export(
            module,
            (torch.zeros(1, obs_dim, dtype=torch.float32),),
            buf,  # type: ignore[arg-type]  # a file object works (documented)
            input_names=["obs"],
            output_names=["action"],
            opset_version=OPSET,
            dynamo=False,
        )
    return buf.getvalue()


def torch_outputs(module: Any, inputs: NDArray[np.float32]) -> NDArray[np.float32]:
    import torch

    with torch.no_grad():
        out = module(torch.as_tensor(np.asarray(inputs, np.float32)))
    return np.asarray(out.numpy(), dtype=np.float32)


def verify(onnx_bytes: bytes, module: Any, inputs: NDArray[np.float32], tol: float = 1e-5) -> float:
    """Largest |onnxruntime - torch| over `inputs` (k, obs_dim), one row at a time as the
    agent runs it; PolicyError if above `tol`."""
    sess = ort_session(onnx_bytes, "exported policy")
    name = sess.get_inputs()[0].name
    X = np.asarray(inputs, np.float32)
    ref = torch_outputs(module, X)
    got = np.concatenate([sess.run(None, {name: X[i : i + 1]})[0] for i in range(len(X))])
    err = float(np.max(np.abs(got - ref))) if len(X) else 0.0
    if not err <= tol:
        raise PolicyError(
            f"exported ONNX policy disagrees with the trainer by {err:.3g} (tolerance {tol:g})"
        )
    return err
