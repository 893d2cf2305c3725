"""The shared argument checks, and that the public constructors use them."""

from __future__ import annotations

import math
import re
from typing import Any

import pytest

from asynclock import AsyncLock, Deduper, MemoryState
from asynclock._validate import check_key, check_seconds, check_ttl, ttl_ms


class TestCheckKey:
    def test_returns_a_non_empty_str(self) -> None:
        assert check_key("k") == "k"

    def test_empty_is_a_value_error(self) -> None:
        with pytest.raises(ValueError, match="key must be a non-empty string, got ''"):
            check_key("")

    @pytest.mark.parametrize("bad", [None, 1, b"k", ["k"]], ids=repr)
    def test_non_str_is_a_type_error_naming_the_type(self, bad: object) -> None:
        with pytest.raises(TypeError, match=re.escape(type(bad).__name__)):
            check_key(bad)

    def test_message_uses_the_given_name(self) -> None:
        with pytest.raises(ValueError, match=r"^event id must"):
            check_key("", "event id")


class TestCheckSeconds:
    @pytest.mark.parametrize("value", [0.5, 1, 30.0, 1e9])
    def test_positive_finite_numbers_pass_as_float(self, value: float) -> None:
        result = check_seconds(value, "ttl")
        assert result == value
        assert type(result) is float

    @pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf], ids=repr)
    def test_non_finite_is_a_value_error_naming_the_value(self, value: float) -> None:
        with pytest.raises(ValueError, match=rf"ttl must be a finite .*{re.escape(repr(value))}"):
            check_seconds(value, "ttl")

    @pytest.mark.parametrize("value", [-1, -0.001, 0, 0.0], ids=repr)
    def test_non_positive_is_a_value_error_naming_the_value(self, value: float) -> None:
        with pytest.raises(
            ValueError, match=rf"timeout must be > 0 .*got {re.escape(repr(value))}"
        ):
            check_seconds(value, "timeout")

    def test_zero_allowed_when_asked(self) -> None:
        assert check_seconds(0, "timeout", allow_zero=True) == 0.0
        with pytest.raises(ValueError, match=">= 0"):
            check_seconds(-1, "timeout", allow_zero=True)

    def test_none_only_when_allowed(self) -> None:
        assert check_seconds(None, "timeout", allow_none=True) is None
        with pytest.raises(TypeError, match="got None"):
            check_seconds(None, "timeout")

    @pytest.mark.parametrize("value", [True, False, "1", b"1", [1], 1j], ids=repr)
    def test_non_numbers_and_bools_are_type_errors(self, value: object) -> None:
        with pytest.raises(TypeError, match=re.escape(repr(value))):
            check_seconds(value, "ttl")

    def test_message_names_the_key(self) -> None:
        with pytest.raises(ValueError, match="key 'ig:contact:42'"):
            check_seconds(-1, "ttl", key="ig:contact:42")


class TestCheckTtl:
    def test_below_a_millisecond_is_rejected(self) -> None:
        with pytest.raises(ValueError, match=r"at least 0\.001 .*0\.0001"):
            check_ttl(0.0001)

    def test_a_millisecond_passes(self) -> None:
        assert check_ttl(0.001) == 0.001

    def test_zero_is_rejected(self) -> None:
        with pytest.raises(ValueError, match="> 0"):
            check_ttl(0)


class TestTtlMs:
    @pytest.mark.parametrize(
        ("seconds", "ms"), [(0.001, 1), (0.0004, 1), (1e-9, 1), (0.2, 200), (30.0, 30000)]
    )
    def test_converts_and_never_rounds_to_zero(self, seconds: float, ms: int) -> None:
        assert ttl_ms(seconds) == ms


class TestPublicConstructorsValidate:
    """The primitives reject bad input when built, before any server call."""

    @pytest.mark.parametrize("ttl", [0, -1, math.nan, math.inf], ids=repr)
    def test_lock_ttl(self, ttl: float) -> None:
        with pytest.raises(ValueError, match=re.escape(repr(ttl))):
            AsyncLock(MemoryState(), "k", ttl=ttl)

    def test_lock_empty_key(self) -> None:
        with pytest.raises(ValueError, match="key"):
            AsyncLock(MemoryState(), "")

    def test_lock_negative_timeout(self) -> None:
        with pytest.raises(ValueError, match=re.escape("-1")):
            AsyncLock(MemoryState(), "k", timeout=-1)

    def test_lock_wrong_key_type(self) -> None:
        make: Any = AsyncLock
        with pytest.raises(TypeError):
            make(MemoryState(), 42)

    @pytest.mark.parametrize("ttl", [0, -1, math.nan, math.inf], ids=repr)
    def test_deduper_ttl(self, ttl: float) -> None:
        with pytest.raises(ValueError, match=re.escape(repr(ttl))):
            Deduper(MemoryState(), ttl=ttl)

    def test_deduper_empty_namespace(self) -> None:
        with pytest.raises(ValueError, match="namespace"):
            Deduper(MemoryState(), namespace="")
