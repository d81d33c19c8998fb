"""Parsing and formatting of human units."""

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from trainsched.errors import TrainschedError
from trainsched.units import (
    format_bandwidth,
    format_duration,
    format_flops,
    format_flops_rate,
    format_number,
    format_size,
    format_size_flag,
    is_int,
    parse_bandwidth,
    parse_duration,
    parse_flops_rate,
    parse_size,
)

# Three significant digits: the worst relative error is 0.5 / 100.
PRECISION = 0.005


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("16GiB", 16 * 2**30),
        ("8GB", 8 * 10**9),
        ("512MiB", 512 * 2**20),
        ("1.5 GB", 1_500_000_000),
        ("100", 100),
        ("4KiB", 4096),
        ("2KB", 2000),
        ("2kB", 2000),
        ("7B", 7),
        ("3TB", 3 * 10**12),
        ("1TiB", 2**40),
        ("  2 MB ", 2_000_000),
        ("1e3B", 1000),
        ("0.5B", 0),  # nearest byte (half to even)
        ("1.6B", 2),
        (100, 100),
        (2.4, 2),
    ],
)
def test_parse_size(text, expected):
    assert parse_size(text) == expected
    assert isinstance(parse_size(text), int)


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("-3GB", "negative"),
        ("12XB", "unknown unit 'XB'"),
        ("", "expected a number"),
        ("GB", "expected a number"),
        ("nan", "finite"),
        ("inf", "finite"),
        ("-inf", "finite"),
        ("1e400GB", "finite"),
        ("3 G B", "expected a number"),
        ("8gb", "unknown unit"),
    ],
)
def test_parse_size_errors(text, problem):
    with pytest.raises(TrainschedError) as info:
        parse_size(text)
    message = str(info.value)
    assert repr(text) in message
    assert problem in message


def test_unknown_unit_lists_accepted_units():
    with pytest.raises(TrainschedError, match="accepted units: B, kB, KB, MB, GB, TB, KiB"):
        parse_size("12XB")


@pytest.mark.parametrize("value", [True, None, [1], float("nan"), -1])
def test_parse_size_rejects_non_numbers(value):
    with pytest.raises(TrainschedError, match="invalid size"):
        parse_size(value)


@pytest.mark.parametrize(
    ("value", "expected"),
    [(16 * 2**30, "16.0 GiB"), (1536, "1.50 KiB"), (512, "512 B"), (0, "0 B"),
     (1023, "1023 B"), (1024, "1.00 KiB"), (300 * 2**20, "300 MiB"), (2**40, "1.00 TiB")],
)
def test_format_size(value, expected):
    assert format_size(value) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [("134us", 134e-6), ("134µs", 134e-6), ("134μs", 134e-6), ("134 us", 134e-6),
     ("2.5ms", 2.5e-3), ("1s", 1.0), ("100ns", 100e-9), ("0.2", 0.2), ("0", 0.0), (3, 3.0)],
)
def test_parse_duration(text, expected):
    assert math.isclose(parse_duration(text), expected, rel_tol=1e-12)


@pytest.mark.parametrize(
    ("text", "problem"),
    [("-1ms", "negative"), ("3min", "unknown unit 'min'"), ("5h", "unknown unit 'h'"),
     ("inf", "finite"), ("nan", "finite"), ("", "expected a number"), ("ms", "expected")],
)
def test_parse_duration_errors(text, problem):
    with pytest.raises(TrainschedError) as info:
        parse_duration(text)
    assert repr(text) in str(info.value)
    assert problem in str(info.value)


def test_duration_unknown_unit_lists_accepted():
    with pytest.raises(TrainschedError, match=r"ns, us, µs, μs, ms, s"):
        parse_duration("3min")


@pytest.mark.parametrize(
    ("value", "expected"),
    [(134e-6, "134 µs"), (2.5e-3, "2.50 ms"), (1.2, "1.20 s"), (800e-9, "800 ns"), (0, "0 s"),
     (42.0, "42.0 s"), (3600.0, "3600 s")],
)
def test_format_duration(value, expected):
    assert format_duration(value) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [("12.5GB/s", 12.5e9), ("5.7 GB/s", 5.7e9), ("100Gbit/s", 12.5e9), ("100Gbps", 12.5e9),
     ("25 Gb/s", 3.125e9), ("900GiB/s", 900 * 2**30), ("1.5MB/s", 1.5e6), ("10Mbit/s", 1.25e6),
     ("8bit/s", 1.0), ("1000", 1000.0), (2e9, 2e9), ("1kB/s", 1000.0)],
)
def test_parse_bandwidth(text, expected):
    assert math.isclose(parse_bandwidth(text), expected, rel_tol=1e-12)


@pytest.mark.parametrize(
    ("text", "problem"),
    [("0GB/s", "greater than 0"), ("0", "greater than 0"), ("-1GB/s", "negative"),
     ("12XB/s", "unknown unit 'XB/s'"), ("12GB", "unknown unit 'GB'"), ("inf", "finite"),
     ("", "expected a number"), ("GB/s", "expected a number")],
)
def test_parse_bandwidth_errors(text, problem):
    with pytest.raises(TrainschedError) as info:
        parse_bandwidth(text)
    assert repr(text) in str(info.value)
    assert problem in str(info.value)


@pytest.mark.parametrize(
    ("value", "expected"),
    [(12.5e9, "12.5 GB/s"), (5.7e9, "5.70 GB/s"), (150e9, "150 GB/s"), (500, "500 B/s"),
     (2.039e12, "2.04 TB/s")],
)
def test_format_bandwidth(value, expected):
    assert format_bandwidth(value) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [("15.7TFLOP/s", 15.7e12), ("15.7 TFLOPS", 15.7e12), ("989TFLOPS", 989e12),
     ("100GFLOP/s", 100e9), ("1e11", 1e11), ("2 PFLOP/s", 2e15), ("5 tflops", 5e12)],
)
def test_parse_flops_rate(text, expected):
    assert math.isclose(parse_flops_rate(text), expected, rel_tol=1e-12)


@pytest.mark.parametrize(
    ("text", "problem"),
    [("0TFLOPS", "greater than 0"), ("-1TFLOPS", "negative"), ("10XFLOPS", "unknown unit"),
     ("nan", "finite"), ("TFLOPS", "expected a number")],
)
def test_parse_flops_rate_errors(text, problem):
    with pytest.raises(TrainschedError) as info:
        parse_flops_rate(text)
    assert repr(text) in str(info.value)
    assert problem in str(info.value)


def test_format_flops():
    assert format_flops_rate(15.7e12) == "15.7 TFLOP/s"
    assert format_flops_rate(989.4e12) == "989 TFLOP/s"
    assert format_flops(8.18e9) == "8.18 GFLOP"
    assert format_flops(12) == "12.0 FLOP"


@pytest.mark.parametrize(("value", "expected"), [
    (9999.0, "9999 s"),            # four digits stay plain
    (12345.0, "12.3e3 s"),         # from 10000 on: three digits and a power of 1000
    (86400.0, "86.4e3 s"),
    (999_999.0, "1.00e6 s"),       # rounding up reaches the next power of 1000
    (1e300, "1.00e300 s"),         # not a 301-digit number
    (2.5e-300, "0.00 ns"),         # tiny values are not the problem: nanoseconds
])
def test_huge_durations_use_engineering_notation(value, expected):
    assert format_duration(value) == expected


def test_huge_sizes_and_numbers_use_engineering_notation():
    assert format_size(909494701772928256 * 2**40) == "909e15 TiB"
    assert format_size(20_000 * 2**40) == "20.0e3 TiB"
    assert format_flops(3e20) == "300e3 PFLOP"
    assert format_number(349.25) == "349.2" and format_number(0.5, 2) == "0.50"
    assert format_number(123_456_789.0) == "123e6"
    assert format_number(float("inf")) == "inf"


@given(st.floats(min_value=1e4, max_value=1e300))
def test_engineering_notation_parses_back(seconds):
    assert math.isclose(parse_duration(format_duration(seconds)), seconds, rel_tol=PRECISION)


@pytest.mark.parametrize(("value", "expected"), [
    (4 << 20, "4MiB"), (3 << 30, "3GiB"), (1536 << 20, "1.5GiB"), (4096, "4KiB"),
    ((5 << 20) + 4096, "5.00390625MiB"), (512, "512B"), (0, "0B"),
])
def test_format_size_flag_is_exact_in_binary_units(value, expected):
    assert format_size_flag(value) == expected
    assert parse_size(expected) == value


@given(st.integers(min_value=0, max_value=2**50))
def test_format_size_flag_round_trips(n):
    assert parse_size(format_size_flag(n)) == n


def _close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=PRECISION, abs_tol=0.5)


@given(st.integers(min_value=0, max_value=2**52))
def test_size_round_trip(n):
    assert _close(parse_size(format_size(n)), n)


@given(st.floats(min_value=1e-9, max_value=1e5))
def test_duration_round_trip(seconds):
    assert math.isclose(parse_duration(format_duration(seconds)), seconds, rel_tol=PRECISION)


@given(st.floats(min_value=1.0, max_value=1e15))
def test_bandwidth_round_trip(bps):
    assert math.isclose(parse_bandwidth(format_bandwidth(bps)), bps, rel_tol=PRECISION)


@given(st.floats(min_value=1.0, max_value=1e18))
def test_flops_rate_round_trip(rate):
    assert math.isclose(parse_flops_rate(format_flops_rate(rate)), rate, rel_tol=PRECISION)


@given(st.floats(min_value=0, max_value=1e6, allow_nan=False),
       st.sampled_from(["B", "kB", "MB", "GB", "KiB", "MiB", "GiB", "TiB"]))
def test_parse_size_matches_multiplier(value, unit):
    factor = {"B": 1, "kB": 1e3, "MB": 1e6, "GB": 1e9, "KiB": 2**10, "MiB": 2**20,
              "GiB": 2**30, "TiB": 2**40}[unit]
    assert abs(parse_size(f"{value!r}{unit}") - value * factor) <= 0.5 + 1e-9 * value * factor


@pytest.mark.parametrize("value", [0, 1, -3, 2**70])
def test_is_int_accepts_python_ints(value):
    assert is_int(value)


@pytest.mark.parametrize("value", [True, False, 1.0, "1", None, 3 + 0j])
def test_is_int_refuses_bools_and_non_ints(value):
    assert not is_int(value)

