# lit configuration for the CUDA backend's GoogleTest suite (mtrt-cuda-tests,
# built wherever the CUDA toolkit is), run case by case like the units. On a
# machine without a visible GPU (CI) the cases that need one report as
# skipped (GTEST_SKIP, with the reason on their output), the others (the
# arena plan, the host side of each op case) run; lit notes the reason once.
import os
import subprocess

import lit.formats

config.name = "megatron-gpu"
config.test_format = lit.formats.GoogleTest(".", "-cuda-tests")
config.test_source_root = config.megatron_tools_dir
config.test_exec_root = config.megatron_tools_dir

_probe = os.path.join(config.megatron_tools_dir, "mtrt-cuda-tests")
if os.path.exists(_probe):
    _check = subprocess.run([_probe, "--mtrt-device-check"],
                            capture_output=True, text=True)
    if _check.returncode != 0:
        lit_config.note("the GPU tests of mtrt-cuda-tests report as skipped: "
                        + (_check.stdout + _check.stderr).strip())
