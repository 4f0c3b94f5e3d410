"""`Policy`: an ONNX model plus the spec it was trained with and its training record
(docs/ARCHITECTURE.md §4). `act(obs)` runs the model with onnxruntime, exactly as the robot agent will;
`save`/`load` use the policy artifact layout (policy.onnx + policy.json).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from devices.robots.wire.policy_spec import PolicySpec, PolicySpecError
from policies.errors import PolicyError
from resources import atomic

FORMAT = "twinbench-policy"
VERSION = 1


def ort_session(onnx_bytes: bytes, where: str = "policy") -> Any:
    """A single-threaded onnxruntime CPU session (PolicyError if the bytes do not load)."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    opts.inter_op_num_threads = 1
    opts.log_severity_level = 3
    try:
        return ort.InferenceSession(
            onnx_bytes, sess_options=opts, providers=["CPUExecutionProvider"]
        )
    except Exception as exc:  # onnxruntime raises its own untyped errors
        raise PolicyError(f"{where}: not a loadable ONNX model ({exc})") from None


@dataclass
class Policy:
    """A trained policy: ONNX bytes, spec, and what made it (task, twin, trainer, curve)."""

    onnx: bytes
    spec: PolicySpec
    record: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._session: Any = None

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.onnx).hexdigest()

    def session(self) -> Any:
        if self._session is None:
            self._session = ort_session(self.onnx)
            inp = self._session.get_inputs()
            if len(inp) != 1:
                raise PolicyError(f"policy model must have one input, it has {len(inp)}")
            self._in = inp[0].name
            shape = inp[0].shape
            self._batched = len(shape) == 2
            last = shape[-1] if shape else None
            if isinstance(last, int) and last != self.spec.obs_dim:
                raise PolicyError(
                    f"policy model takes {last} values but its spec's observation "
                    f"{list(self.spec.observation)} has {self.spec.obs_dim}"
                )
        return self._session

    def act(self, obs: NDArray[Any]) -> NDArray[np.float32]:
        """Action in [-1, 1] (n,) for one observation vector (float32)."""
        s = self.session()
        x = np.asarray(obs, dtype=np.float32).reshape((1, -1) if self._batched else (-1,))
        out = np.asarray(s.run(None, {self._in: x})[0], dtype=np.float32).reshape(-1)
        if out.size != self.spec.n:
            raise PolicyError(f"policy outputs {out.size} values for {self.spec.n} joints")
        return out

    def save(self, folder: Path) -> None:
        """policy.onnx + policy.json (spec, record, sha256 of the model), atomically."""
        folder = Path(folder)
        atomic.write_with(folder / "policy.onnx", self._write_onnx)
        atomic.write_json(
            folder / "policy.json",
            {
                "format": FORMAT,
                "version": VERSION,
                "spec": self.spec.to_dict(),
                "onnx_sha256": self.sha256,
                "record": self.record,
            },
        )

    def _write_onnx(self, path: Path) -> None:
        path.write_bytes(self.onnx)

    @classmethod
    def load(cls, folder: Path) -> Policy:
        """PolicyError naming the file and what is wrong with it."""
        folder = Path(folder)
        meta_path, onnx_path = folder / "policy.json", folder / "policy.onnx"
        try:
            meta = json.loads(meta_path.read_text(encoding="utf-8"))
            onnx = onnx_path.read_bytes()
        except FileNotFoundError as exc:
            raise PolicyError(
                f"{folder}: not a policy folder (missing {Path(exc.filename).name})"
            ) from None
        except (OSError, ValueError) as exc:
            raise PolicyError(f"{meta_path}: unreadable ({exc})") from None
        if not isinstance(meta, Mapping) or meta.get("format") != FORMAT:
            raise PolicyError(f"{meta_path}: not a Twinbench policy file")
        if int(meta.get("version", 0)) > VERSION:
            raise PolicyError(
                f"{meta_path}: policy format version {meta.get('version')} is newer than "
                f"this program reads ({VERSION})"
            )
        if hashlib.sha256(onnx).hexdigest() != meta.get("onnx_sha256"):
            raise PolicyError(f"{onnx_path}: model does not match the sha256 in policy.json")
        try:
            spec = PolicySpec.from_dict(meta.get("spec"), where=str(meta_path))
        except PolicySpecError as exc:
            raise PolicyError(str(exc)) from None
        return cls(onnx, spec, dict(meta.get("record", {})))
