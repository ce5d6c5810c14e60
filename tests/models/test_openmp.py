"""`structspec.openmp.passive_wait`: importing structspec first makes torch's OpenMP threads wait asleep, unless
torch came first or the user chose a wait setting."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

SHOW = "import os; print(os.environ.get('OMP_WAIT_POLICY'))"


def _policy(code: str, **env: str) -> str:
    clean = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    out = subprocess.run([sys.executable, "-c", f"{code}; {SHOW}"], env={**clean, **env}, capture_output=True,
                         text=True, check=True)
    return out.stdout.strip()


def test_importing_structspec_before_torch_makes_openmp_wait_passively() -> None:
    assert _policy("import structspec, torch") == "PASSIVE"


def test_torch_imported_first_is_left_as_it_is() -> None:
    assert _policy("import torch, structspec") == "None"  # libgomp has read its settings: nothing to set


@pytest.mark.parametrize(("name", "value"), [("OMP_WAIT_POLICY", "ACTIVE"), ("GOMP_SPINCOUNT", "100000")])
def test_a_users_own_wait_setting_wins(name: str, value: str) -> None:
    expected = value if name == "OMP_WAIT_POLICY" else "None"
    assert _policy("import structspec", **{name: value}) == expected
