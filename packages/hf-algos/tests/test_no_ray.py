"""hf-algos never imports Ray: the trainers wait, classify errors and find dead workers through
``hf_controller`` (``wait_any``, ``wait_together``, ``is_worker_death``, ``dead_workers``),
so the distributed engine stays the controller's business."""

from __future__ import annotations

import re
from pathlib import Path

import hf_algos

RAY_IMPORT = re.compile(r"^\s*(import ray\b|from ray\b)", re.MULTILINE)


def test_hf_algos_source_has_no_ray_import() -> None:
    root = Path(hf_algos.__file__).parent
    offenders = []
    for path in sorted([*root.rglob("*.py"), *root.rglob("*.pyi")]):
        text = path.read_text(encoding="utf-8")
        for match in RAY_IMPORT.finditer(text):
            line = text.count("\n", 0, match.start()) + 1
            offenders.append(f"{path.relative_to(root.parent)}:{line}")
    assert not offenders, (
        f"Ray imported in hf_algos at {offenders}; use hf_controller's wait_all / wait_any / "
        f"wait_together / is_worker_death / dead_workers (or add what is missing there)"
    )
