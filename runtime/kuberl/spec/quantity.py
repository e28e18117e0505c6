"""Kubernetes resource quantities (``500m``, ``2``, ``1e3``, ``.5``, ``4Gi``): what apimachinery's
``resource.ParseQuantity`` accepts, and the value it gives them. Pure Python, no Kubernetes client.

The grammar, from apimachinery's ``resource.Quantity`` (pkg/api/resource/quantity.go, suffix.go):

    <quantity>  ::= <sign>? <number> <suffix>          (not empty)
    <number>    ::= <digits> | <digits>. | <digits>.<digits> | .<digits>
    <suffix>    ::= "" | n | u | m | k | M | G | T | P | E      (decimal: 10^-9 .. 10^18)
                  | Ki | Mi | Gi | Ti | Pi | Ei                  (binary: 2^10 .. 2^60)
                  | e <sign>? <digits> | E <sign>? <digits>      (an integer exponent; its digits fit int64)

Where the documented BNF and the parser differ, this follows the parser (what an API server enforces):
``n`` and ``u`` are suffixes; an exponent is an integer (``1e1.5`` is refused); and a number may be
empty or a lone ``.`` (``+``, ``.``, ``Ki``, ``e3`` parse as zero), except where the parser's slow path
needs digits: before ``Pi`` or ``Ei``, or before an exponent below -9 (``Pi``, ``e-10`` are refused).
The value is the parser's too: exact, rounded up (away from zero) to 10^-9, and a binary-suffixed value
capped at 2^63-1. (Past an exponent of 10^6 the value is infinite here; apimachinery wraps such an exponent
to 32 bits, which no manifest means.) tests/data/quantities.yaml is the table these rules are checked against.
"""

from __future__ import annotations

import re
from decimal import ROUND_UP, Context, Decimal
from typing import Annotated

from pydantic import BeforeValidator, WithJsonSchema

INT64_MAX = 2**63 - 1

_SUFFIX = r"(?:[numkMGTPE]|[KMGTPE]i|[eE][+-]?[0-9]+)?"
# With no digits, the parser's fast path must take the number: no Pi/Ei, no exponent below -9.
_EMPTY_SUFFIX = r"(?:[numkMGTPE]|[KMGT]i|[eE]\+?[0-9]+|[eE]-0*[0-9])"
QUANTITY_PATTERN = (
    r"^(?:[+-]?(?:(?:[0-9]+\.?[0-9]*|\.[0-9]+)" + _SUFFIX + r"|\.?" + _EMPTY_SUFFIX + r"|\.)|[+-])$"
)
"""The grammar as one regular expression, valid in Python and in RE2 (the API server's CRD ``pattern``).
It leaves one rule out, which :func:`parse_quantity` keeps: an exponent whose digits overflow int64."""

_QUANTITY = re.compile(QUANTITY_PATTERN)
_PARTS = re.compile(r"^([+-]?)([0-9]*)\.?([0-9]*)(.*)$")
_DECIMAL_EXPONENT = {"": 0, "n": -9, "u": -6, "m": -3, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
_BINARY_EXPONENT = {"Ki": 10, "Mi": 20, "Gi": 30, "Ti": 40, "Pi": 50, "Ei": 60}
_NANO = Decimal("1e-9")
_EXPONENT_LIMIT = 10**6  # beyond it Python's Decimal cannot hold the value; a bound is all that matters there


class QuantityError(ValueError):
    """Not a Kubernetes quantity."""


def parse_quantity(text: str) -> Decimal:
    """The value of a Kubernetes quantity, exactly as apimachinery computes it (``"100m"`` -> 0.1,
    ``"1e3"`` -> 1000, ``"1.5Gi"`` -> 1610612736); raises QuantityError for anything the API refuses."""
    if not _QUANTITY.fullmatch(text):
        raise QuantityError(f"{text!r} is not a Kubernetes quantity (such as 2, 500m, 1.5, 1e3, 512Mi, 4Gi)")
    sign, whole, fraction, suffix = _PARTS.fullmatch(text).groups()
    exponent = _DECIMAL_EXPONENT.get(suffix, 0)
    if suffix not in _DECIMAL_EXPONENT and suffix not in _BINARY_EXPONENT:  # e<n> or E<n>
        exponent = int(suffix[1:])
        if not -(2**63) <= exponent <= INT64_MAX:
            raise QuantityError(f"{text!r} is not a Kubernetes quantity (its exponent does not fit 64 bits)")
    if not (whole + fraction).strip("0"):
        return Decimal(0)
    exact = Context(prec=len(text) + 40)  # more digits than any result has: no operation below rounds
    if suffix in _BINARY_EXPONENT:
        value = min(exact.multiply(Decimal(f"{whole or '0'}.{fraction or '0'}"), 2 ** _BINARY_EXPONENT[suffix]),
                    Decimal(INT64_MAX))
    elif exponent > _EXPONENT_LIMIT:  # apimachinery wraps such an exponent to 32 bits; it means "too large"
        value = Decimal("Infinity")
    else:
        value = Decimal(f"{whole or '0'}.{fraction or '0'}e{max(exponent, -_EXPONENT_LIMIT)}")
    if value.is_finite() and value.as_tuple().exponent < -9:
        value = value.quantize(_NANO, rounding=ROUND_UP, context=exact)
    return -value if sign == "-" else value


def format_quantity(value: Decimal) -> str:
    """A value >= 0 as a quantity that parses back to exactly it: a whole number with the largest binary
    suffix from Mi up that divides it (8589934592 -> ``8Gi``; CPU counts stay digits) or as digits, else in
    millis (2.5 -> ``2500m``) or nanos (values are exact to 10^-9, as `parse_quantity` gives them)."""
    if value < 0 or not value.is_finite():
        raise QuantityError(f"{value} cannot be written as a quantity here (only finite values >= 0)")
    if value == value.to_integral_value():
        whole = int(value)
        for suffix, exponent in sorted(_BINARY_EXPONENT.items(), key=lambda item: -item[1]):
            if whole and exponent >= 20 and whole % 2**exponent == 0:
                return f"{whole // 2**exponent}{suffix}"
        return str(whole)
    milli = value * 1000
    if milli == milli.to_integral_value():
        return f"{int(milli)}m"
    return f"{int((value * 10**9).to_integral_value(rounding=ROUND_UP))}n"


def quantity_text(value: object) -> str:
    """A manifest's quantity as text: a string as written, a YAML integer as its digits (``2`` -> ``"2"``), a whole
    float too (``1e3``, ``2.0``: kubectl sends them to the API server as the integers 1000 and 2). Anything else
    (a fraction such as ``0.5``, a boolean) raises, since Kubernetes' int-or-string refuses it."""
    if isinstance(value, float) and value.is_integer() and abs(value) < 2**63:
        return str(int(value))
    if isinstance(value, float):
        raise QuantityError(f'{value!r} is not a Kubernetes quantity: write a fraction as a string ("{value}" or 500m)')
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise QuantityError(f'{value!r} is not a Kubernetes quantity: give a string such as "500m" or an integer')
    return str(value)


Quantity = Annotated[str, BeforeValidator(quantity_text),
                     WithJsonSchema({"x-kubernetes-int-or-string": True, "pattern": QUANTITY_PATTERN})]
"""A spec field holding a Kubernetes quantity (``2``, ``"500m"``, ``"1e3"``, ``"4Gi"``), kept as the manifest's text.
In the CRD: ``x-kubernetes-int-or-string`` with the grammar as its pattern."""
