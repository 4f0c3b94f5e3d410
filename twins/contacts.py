"""Contact pairs: the friction μ and restitution e of one object against the ground or the
table, as a paper or a user means them.

PyBullet combines a contact's coefficients from its two bodies: the friction is the product
of the two bodies' frictions and the restitution the product of their restitutions
(docs/TRAPS.md, Twin), so no body's own value is the contact's: with the ground's default 0.1 an
object's restitution 0.3 is a contact restitution of 0.03, and a published e = 0.125 cannot
be reached at all. A twin may instead carry the pair's values,

    contacts.<object>.<surface>.friction      μ of that contact (Coulomb ratio)
    contacts.<object>.<surface>.restitution   e of that contact

with <surface> `ground` or `table`. The builder then gives the surface 1.0 and the object
the pair's value, so the contact between them has exactly the pair's μ and e. The bodies'
own `friction` / `restitution` parameters are then not part of the twin (they would be
overwritten); what that implies for their other contacts: the object against anything else
has the pair's value times the other body's, and the surface against another object has
that object's own value.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from twins.errors import TwinError

PREFIX = "contacts"
PAIR_KEYS = ("friction", "restitution")
SURFACES = {"ground": "env.ground", "table": "env.table"}


def pair_name(obj: str, surface: str, key: str) -> str:
    """The parameter name of one coefficient of the (object, surface) contact."""
    return f"{PREFIX}.{obj}.{surface}.{key}"


def parse(names: Iterable[str]) -> dict[str, tuple[str, str, str]]:
    """{parameter name: (object, surface, key)} of every contact-pair parameter in `names`;
    TwinError for a malformed one."""
    out = {}
    for n in names:
        parts = n.split(".")
        if parts[0] != PREFIX:
            continue
        if len(parts) != 4 or parts[2] not in SURFACES or parts[3] not in PAIR_KEYS:
            raise TwinError(
                f"parameter '{n}': a contact pair is {PREFIX}.<object>.<surface>.<key> with "
                f"surface one of {', '.join(SURFACES)} and key one of {', '.join(PAIR_KEYS)}"
            )
        out[n] = (parts[1], parts[2], parts[3])
    return out


def governed(names: Iterable[str]) -> dict[str, dict[str, str | None]]:
    """{body prefix: {key: the pair parameter that sets it, or None for 1.0}} for every body
    a contact pair sets a coefficient of (objects get the pair's value, surfaces 1.0)."""
    out: dict[str, dict[str, str | None]] = {}
    for n, (obj, surface, key) in parse(names).items():
        out.setdefault(f"objects.{obj}", {})[key] = n
        out.setdefault(SURFACES[surface], {})[key] = None
    return out


def check(
    names: Iterable[str], objects: Iterable[str], has_ground: bool, has_table: bool, twin: str
) -> None:
    """TwinError (naming the parameter) for a pair that names an object or a surface the
    twin lacks, an object paired with both surfaces on one coefficient (its single body value
    cannot be both), or a body parameter that a pair would overwrite."""
    names = list(names)
    objs = set(objects)
    have = {"ground": has_ground, "table": has_table}
    seen: dict[tuple[str, str], str] = {}
    for n, (obj, surface, key) in parse(names).items():
        if obj not in objs:
            raise TwinError(
                f"twin '{twin}': parameter '{n}' names object '{obj}', which the twin lacks "
                f"(objects: {', '.join(sorted(objs)) or 'none'})"
            )
        if not have[surface]:
            raise TwinError(f"twin '{twin}': parameter '{n}' names the {surface}, which it lacks")
        other = seen.get((obj, key))
        if other is not None:
            raise TwinError(
                f"twin '{twin}': '{n}' and '{other}' both set object '{obj}''s {key}; PyBullet "
                "gives a body one value, so an object can have one contact pair per coefficient"
            )
        seen[(obj, key)] = n
    for prefix, keys in governed(names).items():
        for key, src in keys.items():
            if f"{prefix}.{key}" in names:
                by = src or next(n for n, p in parse(names).items() if SURFACES[p[1]] == prefix)
                raise TwinError(
                    f"twin '{twin}': parameter '{prefix}.{key}' would be overwritten by the "
                    f"contact pair '{by}'; remove it (twins/contacts.py)"
                )


def body_values(names: Iterable[str], values: Mapping[str, float], prefix: str) -> dict[str, float]:
    """The coefficients the builder writes on body `prefix` because of contact pairs: the
    pair's value on the object, 1.0 on the surface ({} when no pair involves the body)."""
    keys = governed(names).get(prefix, {})
    return {k: (1.0 if src is None else float(values[src])) for k, src in keys.items()}
