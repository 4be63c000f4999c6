"""XLA settings are decided from configuration and applied before jax is imported."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from reactantserver.core.config import Backend, Numerics, RuntimeConfig
from reactantserver.worker.runtime.xla_env import xla_environment


def test_cpu_sets_nothing_by_default() -> None:
    plan = xla_environment(RuntimeConfig(), {})
    assert dict(plan.variables) == {}


def test_cuda_allocator_settings_and_flags(tmp_path: Path) -> None:
    runtime = RuntimeConfig(
        backend=Backend.CUDA, mem_fraction=0.5, preallocate=False, autotune=False
    )
    plan = xla_environment(
        runtime, {"XLA_FLAGS": "--xla_dump_to=/tmp/d"}, autotune_cache_dir=tmp_path
    )
    assert plan.variables["XLA_PYTHON_CLIENT_MEM_FRACTION"] == "0.5"
    assert plan.variables["XLA_PYTHON_CLIENT_PREALLOCATE"] == "false"
    flags = plan.variables["XLA_FLAGS"].split()
    assert flags[0] == "--xla_dump_to=/tmp/d"
    assert "--xla_gpu_autotune_level=0" in flags
    assert f"--xla_gpu_per_fusion_autotune_cache_dir={tmp_path}" in flags


def test_configuration_wins_and_the_override_is_noted() -> None:
    runtime = RuntimeConfig(backend=Backend.CUDA, mem_fraction=0.7)
    plan = xla_environment(runtime, {"XLA_PYTHON_CLIENT_MEM_FRACTION": ".95"})
    assert plan.variables["XLA_PYTHON_CLIENT_MEM_FRACTION"] == "0.7"
    assert any("overrides '.95'" in note for note in plan.notes)


def test_f32_numerics_disables_tf32() -> None:
    plan = xla_environment(RuntimeConfig(numerics=Numerics.F32), {})
    assert plan.variables["NVIDIA_TF32_OVERRIDE"] == "0"


def test_apply_refuses_after_jax_is_imported() -> None:
    code = (
        "import os, jax\n"
        "from reactantserver.core.config import RuntimeConfig, Numerics\n"
        "from reactantserver.worker.runtime.xla_env import apply_xla_environment\n"
        "try:\n"
        "    apply_xla_environment(RuntimeConfig(numerics=Numerics.F32), dict(os.environ))\n"
        "except RuntimeError as e:\n"
        "    print('refused:', e)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "refused: XLA settings must be applied before jax is imported" in done.stdout
