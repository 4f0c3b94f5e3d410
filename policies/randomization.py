"""Domain randomization for training and evaluation: what each episode's twin and sensors
look like (the randomization → `policies.train` arrow of docs/ARCHITECTURE.md §1).

Three sources of physical parameter values, chosen by `mode`:

- `none`: the twin's nominal values (its fitted values when it is a fitted twin version);
- `manual`: per-parameter distributions set by hand on the twin's `ParamSet`
  (`Dist.parse("uniform:0.3:0.8")`, or `"prior"` for the parameter's own prior over its
  bounds); every draw is clipped to the parameter's bounds;
- `posterior`: rows of a fit's posterior samples, an `(n, d)` array with `d` parameter
  names (adaptive DR); each episode takes one row, so correlations are kept.

On top of the physics, every mode may randomize what the sensors give the policy:
joint and object-pose noise, a joint observation latency (whole control ticks), the
object tracker's frame rate and latency (capture to arrival at the agent, drawn per
episode), and tracking dropouts (the object pose freezes; once the newest good pose is
older than `max_stale_s` or the policy's `object_max_age_s` the episode ends as a failure,
exactly as the agent stops a policy whose tracking is stale).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from policies.errors import PolicyError
from twins.params import ParamSet

MODES = ("none", "manual", "posterior")
KINDS = ("uniform", "loguniform", "normal", "lognormal", "fixed", "prior")


@dataclass(frozen=True)
class Dist:
    """One parameter's distribution: uniform/loguniform(a=low, b=high), normal(a=mean,
    b=std), lognormal(a=median, b=sigma of the log), fixed(a), or prior (the Param's own)."""

    kind: str
    a: float = 0.0
    b: float = 0.0

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise PolicyError(f"distribution '{self.kind}' is not one of {KINDS}")
        if not (math.isfinite(self.a) and math.isfinite(self.b)):
            raise PolicyError(f"distribution {self.kind}: numbers must be finite")
        if self.kind in ("uniform", "loguniform") and self.b < self.a:
            raise PolicyError(f"{self.kind}:{self.a:g}:{self.b:g}: high is below low")
        if self.kind in ("loguniform", "lognormal") and self.a <= 0:
            raise PolicyError(f"{self.kind}:{self.a:g}:{self.b:g} needs a positive first number")
        if self.kind in ("normal", "lognormal") and self.b < 0:
            raise PolicyError(f"{self.kind}:{self.a:g}:{self.b:g}: spread must be >= 0")

    @classmethod
    def parse(cls, text: str) -> Dist:
        """`uniform:LO:HI`, `loguniform:LO:HI`, `normal:MEAN:STD`, `lognormal:MEDIAN:SIGMA`,
        `fixed:V` or `prior`."""
        parts = text.strip().split(":")
        kind = parts[0]
        try:
            nums = [float(x) for x in parts[1:]]
        except ValueError:
            raise PolicyError(f"distribution '{text}': numbers expected after '{kind}:'") from None
        need = {"prior": 0, "fixed": 1}.get(kind, 2)
        if len(nums) != need:
            raise PolicyError(f"distribution '{text}': '{kind}' takes {need} number(s)")
        return cls(kind, *nums)

    def to_text(self) -> str:
        if self.kind == "prior":
            return "prior"
        if self.kind == "fixed":
            return f"fixed:{self.a:g}"
        return f"{self.kind}:{self.a:g}:{self.b:g}"

    def sample(self, rng: np.random.Generator, low: float, high: float, prior: str) -> float:
        """One draw, clipped to [low, high] (the parameter's bounds)."""
        kind, a, b = self.kind, self.a, self.b
        if kind == "prior":  # the Param's prior over its bounds (bounds at about 2 sigma)
            kind = prior
            if prior in ("uniform", "loguniform"):
                a, b = low, high
            elif prior == "normal":
                a, b = (low + high) / 2, (high - low) / 4
            else:
                a, b = math.sqrt(low * high), math.log(high / low) / 4
        if kind == "uniform":
            v = rng.uniform(a, b)
        elif kind == "loguniform":
            v = math.exp(rng.uniform(math.log(a), math.log(b)))
        elif kind == "normal":
            v = rng.normal(a, b)
        elif kind == "lognormal":
            v = a * math.exp(rng.normal(0.0, b))
        else:
            v = a
        return float(min(max(v, low), high))


@dataclass(frozen=True)
class SensorNoise:
    """What the policy's sensors get wrong. Latency in control ticks drawn uniformly from
    [latency_ticks_min, latency_ticks_max]; dropouts start at `dropout_rate_hz` and last
    an exponential time of mean `dropout_mean_s`."""

    joint_pos_std: float = 0.0  # rad
    joint_vel_std: float = 0.0  # rad/s
    object_pos_std: float = 0.0  # m
    object_yaw_std: float = 0.0  # rad
    latency_ticks_min: int = 0
    latency_ticks_max: int = 0
    dropout_rate_hz: float = 0.0
    dropout_mean_s: float = 0.1
    max_stale_s: float = 0.5  # tracking older than this stops the policy (a failure)
    object_rate_hz: float = 0.0  # camera tracker's pose rate; 0 = every control tick
    object_latency_s_min: float = 0.0  # capture -> pose at the agent (drawn per episode)
    object_latency_s_max: float = 0.0

    def __post_init__(self) -> None:
        for k, v in self.to_json().items():
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v >= 0):
                raise PolicyError(f"sensor noise '{k}' must be a finite number >= 0, not {v!r}")
        if self.latency_ticks_max < self.latency_ticks_min:
            raise PolicyError("sensor noise: latency_ticks_max is below latency_ticks_min")
        if self.object_latency_s_max < self.object_latency_s_min:
            raise PolicyError("sensor noise: object_latency_s_max is below object_latency_s_min")

    def to_json(self) -> dict[str, float]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> SensorNoise:
        unknown = set(d) - set(cls.__dataclass_fields__)
        if unknown:
            raise PolicyError(f"sensor noise: unknown entries {sorted(unknown)}")
        kw: dict[str, Any] = dict(d)
        for k in ("latency_ticks_min", "latency_ticks_max"):
            if k in kw:
                kw[k] = int(kw[k])
        return cls(**kw)


TYPICAL_NOISE = SensorNoise(
    joint_pos_std=2e-4,
    joint_vel_std=2e-3,
    object_pos_std=2e-3,
    object_yaw_std=0.02,
    latency_ticks_min=0,
    latency_ticks_max=2,
    dropout_rate_hz=0.5,
    dropout_mean_s=0.1,
    object_rate_hz=30.0,  # a RealSense stream through the tracker
    object_latency_s_min=0.03,
    object_latency_s_max=0.1,
)


@dataclass(frozen=True)
class Conditions:
    """One episode's draw: physical parameter values for the twin and sensor behaviour."""

    values: dict[str, float]
    latency_ticks: int = 0
    noise: SensorNoise = field(default_factory=SensorNoise)
    object_latency_s: float = 0.0


@dataclass(frozen=True)
class Randomization:
    """Where each episode's conditions come from (see the module docstring)."""

    mode: str = "none"
    params: Mapping[str, Dist] = field(default_factory=dict)
    names: tuple[str, ...] = ()
    samples: NDArray[np.float64] = field(default_factory=lambda: np.zeros((0, 0)))
    noise: SensorNoise = field(default_factory=SensorNoise)
    source: str = ""  # e.g. the fit artifact the posterior came from

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise PolicyError(f"randomization mode '{self.mode}' is not one of {MODES}")
        if self.mode == "manual" and not self.params:
            raise PolicyError("manual randomization needs at least one parameter distribution")
        if self.mode == "posterior":
            s = np.asarray(self.samples, dtype=float)
            if s.ndim != 2 or s.shape[0] < 1 or s.shape[1] != len(self.names):
                raise PolicyError(
                    f"posterior samples must be (n, {len(self.names)}) for names "
                    f"{list(self.names)}, got shape {s.shape}"
                    + (f" from {self.source}" if self.source else "")
                )
            if not np.all(np.isfinite(s)):
                raise PolicyError(
                    "posterior samples contain NaN or inf"
                    + (f" ({self.source})" if self.source else "")
                )

    def check(self, paramset: ParamSet) -> None:
        """PolicyError naming a parameter the twin does not have (before any training)."""
        for name in [*self.params, *(self.names if self.mode == "posterior" else ())]:
            if name not in paramset:
                raise PolicyError(f"randomization names parameter '{name}', the twin lacks it")

    def sample(self, rng: np.random.Generator, paramset: ParamSet) -> Conditions:
        """One episode's conditions (values are checked against the parameters' bounds)."""
        values: dict[str, float] = {}
        if self.mode == "manual":
            for name, dist in self.params.items():
                p = paramset[name]
                values[name] = dist.sample(rng, p.low, p.high, p.prior)
        elif self.mode == "posterior":
            row = np.asarray(self.samples)[rng.integers(len(self.samples))]
            for name, v in zip(self.names, row, strict=True):
                p = paramset[name]
                values[name] = float(min(max(v, p.low), p.high))
        if self.mode != "none":
            values = {k: v for k, v in paramset.validate(values).items() if k in values}
        n = self.noise
        lat = int(rng.integers(n.latency_ticks_min, n.latency_ticks_max + 1))
        obj_lat = (
            float(rng.uniform(n.object_latency_s_min, n.object_latency_s_max))
            if n.object_latency_s_max > 0
            else 0.0
        )
        return Conditions(values, lat, n, obj_lat)

    def draws(
        self, paramset: ParamSet, n: int = 500, seed: int = 0
    ) -> tuple[list[str], NDArray[np.float64]]:
        """The training distribution as a table: (names, (n, d) values) of the randomized
        parameters over `n` episode draws, to show next to a fit's posterior."""
        rng = np.random.default_rng(seed)
        rows = [self.sample(rng, paramset).values for _ in range(n)]
        names = sorted({k for r in rows for k in r})
        return names, np.array([[r[k] for k in names] for r in rows], dtype=float).reshape(
            n, len(names)
        )

    def nominal(self) -> Randomization:
        """Same sensors, no physical randomization."""
        return Randomization("none", noise=self.noise)

    def to_json(self) -> dict[str, Any]:
        d: dict[str, Any] = {"mode": self.mode, "noise": self.noise.to_json()}
        if self.params:
            d["params"] = {k: v.to_text() for k, v in self.params.items()}
        if self.mode == "posterior":
            d["names"] = list(self.names)
            d["n_samples"] = int(len(self.samples))
            d["source"] = self.source
        return d


def manual(
    specs: Mapping[str, str] | Sequence[str], noise: SensorNoise | None = None
) -> Randomization:
    """Hand-set distributions: {"objects.box.friction": "uniform:0.3:0.8"} or
    ["objects.box.friction=prior", ...]."""
    if not isinstance(specs, Mapping):
        pairs = {}
        for item in specs:
            name, sep, text = item.partition("=")
            if not sep:
                raise PolicyError(f"'{item}': expected NAME=DIST, e.g. objects.box.mass=prior")
            pairs[name.strip()] = text
        specs = pairs
    return Randomization(
        "manual", {k: Dist.parse(v) for k, v in specs.items()}, noise=noise or SensorNoise()
    )


def posterior(
    names: Sequence[str],
    samples: NDArray[np.float64],
    noise: SensorNoise | None = None,
    source: str = "",
) -> Randomization:
    """Adaptive DR from a fit's posterior: `samples` is (n, d), columns named by `names`."""
    return Randomization(
        "posterior",
        names=tuple(str(n) for n in names),
        samples=np.asarray(samples, dtype=float),
        noise=noise or SensorNoise(),
        source=source,
    )


def load_posterior(path: Path, noise: SensorNoise | None = None) -> Randomization:
    """Posterior samples from a fit's samples.npz (arrays `names` and `x`)."""
    try:
        with np.load(Path(path), allow_pickle=False) as z:
            names, x = [str(n) for n in z["names"]], np.asarray(z["x"], dtype=float)
    except (OSError, ValueError, KeyError) as exc:
        raise PolicyError(f"{path}: not readable as posterior samples ({exc})") from None
    if x.size == 0:
        raise PolicyError(f"{path}: the fit has no posterior samples")
    return posterior(names, x, noise, source=str(path))
