"""`Param` and `ParamSet`: the only way a tunable number enters a twin (docs/ARCHITECTURE.md §4).

A parameter has a dotted name (`objects.puck.friction`), an SI unit, a nominal value,
bounds and a prior. Values are plain `dict[str, float]`; `ParamSet.validate` fills in
nominals and refuses unknown names, non-finite values and values outside the bounds with a
`TwinError` that names the parameter.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from twins.errors import TwinError

PRIORS = ("uniform", "loguniform", "normal", "lognormal")
_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_\-]*(\.[A-Za-z0-9_][A-Za-z0-9_\-]*)+$")


@dataclass(frozen=True)
class Param:
    """One tunable number. `prior` is the shape used for randomization and fitting:
    uniform/loguniform over [low, high]; normal/lognormal centred on nominal with the bounds
    at about ±2 sigma. Log priors need low > 0 (multiplicative physics: masses, stiffness).
    `integer` marks counts (solver iterations, substeps)."""

    name: str
    unit: str
    nominal: float
    low: float
    high: float
    prior: str = "uniform"
    integer: bool = False
    doc: str = ""

    def __post_init__(self) -> None:
        if not _NAME_RE.match(self.name):
            raise TwinError(
                f"parameter name '{self.name}' must be dotted words, e.g. 'objects.puck.friction'"
            )
        for label in ("nominal", "low", "high"):
            v = getattr(self, label)
            if not isinstance(v, (int, float)) or not math.isfinite(float(v)):
                raise TwinError(
                    f"parameter '{self.name}': {label} must be a finite number, not {v!r}"
                )
            object.__setattr__(self, label, float(v))
        if not self.low <= self.nominal <= self.high:
            raise TwinError(
                f"parameter '{self.name}': nominal {self.nominal:g} {self.unit} is outside its "
                f"bounds [{self.low:g}, {self.high:g}]"
            )
        if self.prior not in PRIORS:
            raise TwinError(f"parameter '{self.name}': prior '{self.prior}' is not one of {PRIORS}")
        if self.prior in ("loguniform", "lognormal") and self.low <= 0:
            raise TwinError(f"parameter '{self.name}': a {self.prior} prior needs low > 0")

    def check(self, value: Any) -> float:
        """Return `value` as float, or raise TwinError naming this parameter."""
        try:
            v = float(value)
        except (TypeError, ValueError):
            raise TwinError(f"parameter '{self.name}': {value!r} is not a number") from None
        if not math.isfinite(v):
            raise TwinError(f"parameter '{self.name}': value {v} is not finite")
        if v < self.low or v > self.high:
            raise TwinError(
                f"parameter '{self.name}' = {v:g} {self.unit} is outside its bounds "
                f"[{self.low:g}, {self.high:g}] {self.unit}"
            )
        if self.integer:
            v = float(round(v))
        return v

    def with_nominal(self, value: float) -> Param:
        """Copy with a new nominal (checked against the bounds)."""
        return Param(
            self.name,
            self.unit,
            self.check(value),
            self.low,
            self.high,
            self.prior,
            self.integer,
            self.doc,
        )

    def to_json(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "name": self.name,
            "unit": self.unit,
            "nominal": self.nominal,
            "low": self.low,
            "high": self.high,
            "prior": self.prior,
        }
        if self.integer:
            d["integer"] = True
        if self.doc:
            d["doc"] = self.doc
        return d

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Param:
        try:
            return cls(
                str(d["name"]),
                str(d["unit"]),
                d["nominal"],
                d["low"],
                d["high"],
                str(d.get("prior", "uniform")),
                bool(d.get("integer", False)),
                str(d.get("doc", "")),
            )
        except KeyError as exc:
            raise TwinError(f"parameter entry {dict(d)!r} lacks field {exc}") from None


class ParamSet(Mapping[str, Param]):
    """An ordered, immutable collection of parameters keyed by name."""

    def __init__(self, params: Iterable[Param] = ()) -> None:
        self._p: dict[str, Param] = {}
        for prm in params:
            if prm.name in self._p:
                raise TwinError(f"parameter '{prm.name}' is defined twice")
            self._p[prm.name] = prm

    def __getitem__(self, name: str) -> Param:
        try:
            return self._p[name]
        except KeyError:
            raise TwinError(f"twin has no parameter '{name}'") from None

    def __contains__(self, name: object) -> bool:
        return name in self._p

    def get(self, name: str, default: Param | None = None) -> Param | None:  # type: ignore[override]
        return self._p.get(name, default)

    def __iter__(self) -> Iterator[str]:
        return iter(self._p)

    def __len__(self) -> int:
        return len(self._p)

    def __repr__(self) -> str:
        return f"ParamSet({len(self)} params)"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ParamSet) and list(self._p.values()) == list(other._p.values())

    __hash__ = None  # type: ignore[assignment]

    def nominal(self) -> dict[str, float]:
        """Every parameter at its nominal value."""
        return {n: p.nominal for n, p in self._p.items()}

    def validate(self, values: Mapping[str, Any] | None = None) -> dict[str, float]:
        """Nominals overridden by `values`; TwinError on unknown names or bad values."""
        out = self.nominal()
        for name, v in (values or {}).items():
            if name not in self._p:
                close = [n for n in self._p if n.split(".")[-1] == name.split(".")[-1]][:3]
                hint = f" (did you mean {', '.join(close)}?)" if close else ""
                raise TwinError(f"unknown parameter '{name}'{hint}")
            out[name] = self._p[name].check(v)
        return out

    def group(self, prefix: str) -> list[Param]:
        """Parameters whose name starts with `prefix` + '.'."""
        pre = prefix.rstrip(".") + "."
        return [p for n, p in self._p.items() if n.startswith(pre)]

    def replace(self, *params: Param) -> ParamSet:
        """Copy with some parameters replaced by name (they must exist)."""
        new = dict(self._p)
        for prm in params:
            if prm.name not in new:
                raise TwinError(f"twin has no parameter '{prm.name}'")
            new[prm.name] = prm
        return ParamSet(new.values())

    def merged(self, other: Iterable[Param]) -> ParamSet:
        """Copy with parameters added (duplicates are an error)."""
        return ParamSet([*self._p.values(), *other])

    def with_nominals(self, values: Mapping[str, float]) -> ParamSet:
        """Copy where the given values become the nominals (each checked)."""
        return self.replace(*(self[n].with_nominal(v) for n, v in values.items()))

    def to_json(self) -> list[dict[str, Any]]:
        return [p.to_json() for p in self._p.values()]

    @classmethod
    def from_json(cls, items: Iterable[Mapping[str, Any]]) -> ParamSet:
        return cls(Param.from_json(d) for d in items)
