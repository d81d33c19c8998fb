"""Parse and format the human units at trainsched's edges: sizes, durations, bandwidths, FLOPs.

Inside the library every quantity is a plain number in base units (bytes, seconds, bytes per
second, FLOP per second); these functions are the only place where ``"16GiB"``, ``"134us"`` or
``"25Gbit/s"`` turn into numbers and back. Every parser also takes a plain ``int``/``float``
(already in base units), so files and flags may give either. A bad value raises
:class:`TrainschedError` quoting the text and listing what is accepted.

Decimal prefixes (k, M, G, T, P) are powers of 1000, binary ones (Ki, Mi, Gi, Ti) of 1024. In
bandwidths a lower-case ``b`` after the prefix means bits (``25Gb/s``, ``100Gbit/s``,
``100Gbps``) and an upper-case ``B`` bytes (``12.5GB/s``).

:func:`is_int` is the one check of a count or index every module's validation uses: an ``int``
but not a ``bool`` (``True`` is no device count).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping

from trainsched.errors import TrainschedError

__all__ = [
    "format_bandwidth",
    "format_duration",
    "format_flops",
    "format_flops_rate",
    "format_number",
    "format_size",
    "format_size_flag",
    "is_int",
    "parse_bandwidth",
    "parse_duration",
    "parse_flops_rate",
    "parse_size",
]

_DECIMAL = {"k": 1e3, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12}
_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}

SIZE_UNITS: Mapping[str, float] = {
    "B": 1,
    **{f"{p}B": m for p, m in _DECIMAL.items()},
    **{f"{p}B": m for p, m in _BINARY.items()},
}
DURATION_UNITS: Mapping[str, float] = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "μs": 1e-6,
                                       "ms": 1e-3, "s": 1.0}
BANDWIDTH_UNITS: Mapping[str, float] = {
    **{f"{u}/s": m for u, m in SIZE_UNITS.items()},
    "bit/s": 1 / 8, "b/s": 1 / 8, "bps": 1 / 8,
    **{f"{p}{b}": m / 8 for p, m in _DECIMAL.items() for b in ("bit/s", "b/s", "bps")},
}
# FLOP units are matched case-insensitively ("TFLOPS", "Tflop/s"); keys are lower case.
FLOPS_RATE_UNITS: Mapping[str, float] = {
    f"{p}{u}": m
    for p, m in {"": 1, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12, "p": 1e15}.items()
    for u in ("flop/s", "flops")
}

_NUMBER_AND_UNIT = re.compile(r"\s*([+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)\s*(\S*)\s*")


def is_int(value: object) -> bool:
    """True for an ``int`` that is not a ``bool`` (JSON and flags give both)."""
    return isinstance(value, int) and not isinstance(value, bool)


def _accepted(units: Mapping[str, float]) -> str:
    return ", ".join(dict.fromkeys(units))


def _parse(
    text: str | float,
    what: str,
    units: Mapping[str, float],
    example: str,
    *,
    positive: bool = False,
    fold_case: bool = False,
) -> float:
    """Parse ``number [unit]`` (no unit = base unit) into base units, or raise with a hint."""
    hint = f"expected a number with an optional unit ({_accepted(units)}), e.g. {example!r}"
    if isinstance(text, bool):
        raise TrainschedError(f"invalid {what} {text!r}: {hint}")
    if isinstance(text, int | float):
        value = float(text)
    elif isinstance(text, str):
        match = _NUMBER_AND_UNIT.fullmatch(text)
        if match is None and text.strip().lstrip("+-").lower() in ("nan", "inf", "infinity"):
            raise TrainschedError(f"invalid {what} {text!r}: must be a finite number; {hint}")
        if match is None:
            raise TrainschedError(f"invalid {what} {text!r}: {hint}")
        number, unit = match.groups()
        key = unit.lower() if fold_case else unit
        if key and key not in units:
            raise TrainschedError(
                f"invalid {what} {text!r}: unknown unit {unit!r}; accepted units: "
                f"{_accepted(units)} (or none for the base unit), e.g. {example!r}"
            )
        value = float(number) * (units[key] if key else 1.0)
    else:
        raise TrainschedError(f"invalid {what} {text!r}: {hint}")
    if not math.isfinite(value):
        raise TrainschedError(f"invalid {what} {text!r}: must be a finite number; {hint}")
    if value < 0:
        raise TrainschedError(f"invalid {what} {text!r}: must not be negative, e.g. {example!r}")
    if positive and value == 0:
        raise TrainschedError(f"invalid {what} {text!r}: must be greater than 0, e.g. {example!r}")
    return value


def _sig3(value: float) -> str:
    """About three significant digits: 512, 16.0, 1.50; from 10000 on, engineering notation
    (:func:`_engineering`), so that a huge value stays short."""
    magnitude = abs(value)
    if magnitude >= ENGINEERING_FROM and math.isfinite(value):
        return _engineering(value)
    if magnitude >= 100:
        return f"{value:.0f}"
    if magnitude >= 10:
        return f"{value:.1f}"
    return f"{value:.2f}"


#: Magnitudes from which formatted numbers switch to engineering notation.
ENGINEERING_FROM = 1e4


def _engineering(value: float) -> str:
    """Three significant digits times a power of ten that is a multiple of 3: ``"12.3e3"``,
    ``"909e15"``, ``"1.00e300"``."""
    exponent = 3 * (math.floor(math.log10(abs(value))) // 3)
    mantissa = value / 10.0**exponent
    if abs(float(f"{mantissa:.3g}")) >= 1000:  # rounds up to the next power of 1000
        exponent += 3
        mantissa = value / 10.0**exponent
    magnitude = abs(mantissa)
    digits = 0 if magnitude >= 100 else 1 if magnitude >= 10 else 2
    return f"{mantissa:.{digits}f}e{exponent}"


def format_number(value: float, decimals: int = 1) -> str:
    """A plain number (a rate, a ratio) with ``decimals`` decimals, or in engineering notation
    from a million on: ``"349.2"``, ``"1.23e9"``."""
    if abs(value) >= 1e6 and math.isfinite(value):
        return _engineering(value)
    return f"{value:.{decimals}f}"


def _scaled(value: float, steps: list[tuple[float, str]], base: str) -> str:
    """Format with the largest unit of ``steps`` (ascending factors) that keeps ``value`` >= 1."""
    factor, unit = 1.0, base
    for step_factor, step_unit in steps:
        if abs(value) >= step_factor:
            factor, unit = step_factor, step_unit
    return f"{_sig3(value / factor)} {unit}"


def parse_size(text: str | float) -> int:
    """Bytes from ``"16GiB"``, ``"8GB"``, ``"1.5 GB"``, ``"100"`` (bytes); rounded to a byte."""
    return round(_parse(text, "size", SIZE_UNITS, "16GiB"))


def format_size(size_bytes: float) -> str:
    """Binary units, about three significant digits: ``"16.0 GiB"``, ``"1.50 KiB"``, ``"512 B"``."""
    if abs(size_bytes) < 1024:
        return f"{size_bytes:.0f} B"
    return _scaled(size_bytes, [(float(m), f"{p}B") for p, m in _BINARY.items()], "B")


def format_size_flag(size_bytes: int) -> str:
    """A whole number of bytes as a flag takes it back exactly (:func:`parse_size`), in the
    largest binary unit it reaches: ``"4MiB"``, ``"5.00390625MiB"``, ``"1.5GiB"``, ``"512B"``."""
    for unit, factor in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(size_bytes) >= factor:
            value = size_bytes / factor  # exact: a power-of-two divisor, bytes below 2**53
            text = repr(value)
            return f"{text[:-2] if text.endswith('.0') else text}{unit}"
    return f"{size_bytes}B"


def parse_duration(text: str | float) -> float:
    """Seconds from ``"134us"``, ``"134µs"``, ``"2.5ms"``, ``"1s"``, ``"100ns"``, ``"0.2"`` (s)."""
    return _parse(text, "duration", DURATION_UNITS, "134us")


def format_duration(seconds: float) -> str:
    """``"800 ns"``, ``"134 µs"``, ``"2.50 ms"``, ``"1.20 s"``; zero is ``"0 s"``."""
    if seconds == 0:
        return "0 s"
    magnitude = abs(seconds)
    for factor, unit in ((1.0, "s"), (1e-3, "ms"), (1e-6, "µs")):
        if magnitude >= factor:
            return f"{_sig3(seconds / factor)} {unit}"
    return f"{_sig3(seconds / 1e-9)} ns"


def parse_bandwidth(text: str | float) -> float:
    """Bytes per second from ``"12.5GB/s"``, ``"100Gbit/s"``, ``"25 Gb/s"``, ``"900GiB/s"``.

    Bits (``bit/s``, ``b/s``, ``bps`` after a decimal prefix) are divided by 8. Must be > 0.
    """
    return _parse(text, "bandwidth", BANDWIDTH_UNITS, "12.5GB/s", positive=True)


def format_bandwidth(bytes_per_s: float) -> str:
    """Decimal byte units: ``"12.5 GB/s"``."""
    return _scaled(bytes_per_s, [(1e3, "kB/s"), (1e6, "MB/s"), (1e9, "GB/s"), (1e12, "TB/s")],
                   "B/s")


def parse_flops_rate(text: str | float) -> float:
    """FLOP per second from ``"15.7TFLOP/s"``, ``"989 TFLOPS"``, ``"100GFLOP/s"``. Must be > 0."""
    return _parse(text, "FLOP rate", FLOPS_RATE_UNITS, "15.7TFLOP/s", positive=True,
                  fold_case=True)


_FLOP_STEPS = [(1e3, "kFLOP"), (1e6, "MFLOP"), (1e9, "GFLOP"), (1e12, "TFLOP"), (1e15, "PFLOP")]


def format_flops_rate(flops_per_s: float) -> str:
    """``"15.7 TFLOP/s"``."""
    return _scaled(flops_per_s, [(f, f"{u}/s") for f, u in _FLOP_STEPS], "FLOP/s")


def format_flops(count: float) -> str:
    """A FLOP count: ``"8.18 GFLOP"``."""
    return _scaled(count, _FLOP_STEPS, "FLOP")
