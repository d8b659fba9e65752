"""tools/verl_tests.py: how verl's tests are rewritten (imports only) and laid out."""

from __future__ import annotations

import tarfile
from pathlib import Path

import pytest
import verl_tests


def test_imports_point_at_the_compat_modules_and_nothing_else_changes() -> None:
    source = (
        "import ray\n"
        "from verl import DataProto\n"
        "from verl.protocol import DataProtoConfig, union_numpy_dict\n"
        "from verl.single_controller.base.decorator import Dispatch, register\n"
        "from verl.single_controller.ray.base import RayWorkerGroup\n"
        "from verl.utils.device import get_device_name\n"
        "import verl.utils.tensordict_utils as tu\n"
        "from verl.utils import tensordict_utils as tu\n"
        "    from verl.protocol import fold_batch_dim\n"
        "pool = RayResourcePool([4], use_gpu=True)  # verl.protocol in comments too\n"
    )
    rewritten = verl_tests.rewrite(source, "cpu").splitlines()
    assert rewritten == [
        "import ray",
        "from hf_protocol.compat.verl import DataProto",
        "from hf_protocol.compat.verl import DataProtoConfig, union_numpy_dict",
        "from hf_controller.compat.verl import Dispatch, register",
        "from hf_controller.compat.verl import RayWorkerGroup",
        "from hf_controller.compat.verl import get_device_name",
        "import hf_protocol.compat.verl_tensordict as tu",
        "import hf_protocol.compat.verl_tensordict as tu",
        "    from hf_protocol.compat.verl import fold_batch_dim",
        "pool = RayResourcePool([4], use_gpu=True)  # hf_protocol.compat.verl in comments too",
    ]


def test_resource_only_files_run_without_gpus() -> None:
    line = "pool = RayResourcePool([4], use_gpu=True)\n"
    assert verl_tests.rewrite(line, "resources") == "pool = RayResourcePool([4], use_gpu=False)\n"
    assert verl_tests.rewrite(line, "cpu") == line
    # verl's default is use_gpu=True: a pool that does not say gets use_gpu=False too
    default = "resource_pool = RayResourcePool(process_on_nodes=[2])\n"
    expected = "resource_pool = RayResourcePool(process_on_nodes=[2], use_gpu=False)\n"
    assert verl_tests.rewrite(default, "resources") == expected
    assert verl_tests.rewrite(default, "cpu") == default


def test_a_verl_import_without_a_compat_module_stops_the_run() -> None:
    with pytest.raises(SystemExit, match=r"verl\.trainer\.ppo"):
        verl_tests.rewrite("from verl.trainer.ppo import core_algos\n", "cpu")


def test_every_verl_single_controller_file_is_in_scope_or_excluded_with_a_reason() -> None:
    listed = set(verl_tests.IN_SCOPE) | set(verl_tests.EXCLUDED_FILES)
    assert not set(verl_tests.IN_SCOPE) & set(verl_tests.EXCLUDED_FILES)
    assert all(reason.strip() for reason in verl_tests.EXCLUDED_FILES.values())
    assert all(reason.strip() for reason in verl_tests.EXCEPTIONS.values())
    assert all(node.split("::")[0] in verl_tests.IN_SCOPE for node in verl_tests.EXCEPTIONS)
    assert "test_protocol_on_cpu.py" in listed
    assert sum(name.startswith("single_controller/") for name in listed) == 18


def test_prepare_copies_the_tests_in_scope_rewritten(tmp_path: Path) -> None:
    sdist = tmp_path / "cache" / f"verl-{verl_tests.VERL_VERSION}.tar.gz"
    sdist.parent.mkdir()
    source = tmp_path / "src" / f"verl-{verl_tests.VERL_VERSION}"
    for relative in [*verl_tests.IN_SCOPE, "single_controller/test_rvdz.py"]:
        path = source / "tests" / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("from verl import DataProto\n")
    (source / "verl").mkdir()
    (source / "verl" / "protocol.py").write_text("# verl's own code is not unpacked\n")
    with tarfile.open(sdist, "w:gz") as tar:
        tar.add(source, arcname=source.name)
    tests = verl_tests.download(sdist.parent)  # the archive is there: no pip
    assert not (sdist.parent / source.name / "verl").exists()
    paths = verl_tests.prepare(tests, tmp_path / "work")
    assert paths == list(verl_tests.IN_SCOPE)
    for relative in paths:
        text = (tmp_path / "work" / relative).read_text()
        assert text == "from hf_protocol.compat.verl import DataProto\n"
    assert not (tmp_path / "work" / "single_controller" / "test_rvdz.py").exists()
