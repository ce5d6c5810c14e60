"""`structspec.openmp.short_spin`: importing structspec first makes torch's OpenMP threads spin briefly, then
sleep, unless torch came first or the user chose a wait setting."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

SHOW = "import os; print(os.environ.get('GOMP_SPINCOUNT'), os.environ.get('OMP_WAIT_POLICY'))"


def _waiting(code: str, **env: str) -> str:
    clean = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    out = subprocess.run([sys.executable, "-c", f"{code}; {SHOW}"], env={**clean, **env}, capture_output=True,
                         text=True, check=True)
    return out.stdout.strip()


def test_importing_structspec_before_torch_makes_openmp_spin_briefly() -> None:
    assert _waiting("import structspec, torch") == "1000 None"


def test_torch_imported_first_is_left_as_it_is() -> None:
    assert _waiting("import torch, structspec") == "None None"  # libgomp has read its settings: nothing to set


@pytest.mark.parametrize(("name", "value", "expected"), [("OMP_WAIT_POLICY", "ACTIVE", "None ACTIVE"),
                                                         ("GOMP_SPINCOUNT", "100000", "100000 None")])
def test_a_users_own_wait_setting_wins(name: str, value: str, expected: str) -> None:
    assert _waiting("import structspec", **{name: value}) == expected
