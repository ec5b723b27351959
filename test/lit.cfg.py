# lit configuration for the FileCheck suites under test/.
import os
import subprocess

import lit.formats
from lit.llvm import llvm_config
from lit.llvm.subst import ToolSubst

config.name = "megatron"
config.test_format = lit.formats.ShTest(not llvm_config.use_lit_shell)
config.suffixes = [".mlir", ".test"]
config.excludes = ["unit", "gpu", "Inputs", "CMakeLists.txt", "lit.cfg.py"]
config.test_source_root = os.path.dirname(__file__)
config.test_exec_root = os.path.join(config.megatron_obj_root, "test")

# Captured variables do not leak from one CHECK-LABEL block to the next.
config.environment["FILECHECK_OPTS"] = "-enable-var-scope"

config.substitutions.append(("%megatron_src_root", config.megatron_src_root))
config.substitutions.append(("%megatron_obj_root", config.megatron_obj_root))
config.substitutions.append(("%megatron_lib_dir", config.megatron_lib_dir))
config.substitutions.append(("%python", config.python_executable))
# Drops the mt.layer attributes (#mt.layer) from printed IR, for checks
# about something else: `megatron-opt ... | %drop-layers | FileCheck %s`.
config.substitutions.append(
    ("%drop-layers",
     "sed -E -e 's/mt\\.layer = #mt\\.layer<[^>]*>(, )?//g' "
     "-e 's/, \\}/}/g' -e 's/ \\{\\}//g'"))

# GPT-2's encoder.json and vocab.bpe (tools/setup.sh fetches them); tests
# that need them say "REQUIRES: gpt2-tokenizer".
config.substitutions.append(("%gpt2_dir", config.gpt2_dir))
if all(os.path.isfile(os.path.join(config.gpt2_dir, name))
       for name in ("encoder.json", "vocab.bpe")):
    config.available_features.add("gpt2-tokenizer")

# The Python module's tests need NumPy and the Python the module was built
# for: the configured interpreter, or Debian's (python3-numpy) when the
# configured one (e.g. a pyenv shim) lacks NumPy.
def _python_with_numpy():
    import glob
    import subprocess
    modules = glob.glob(os.path.join(config.megatron_obj_root, "python",
                                     "mtrt.cpython-*.so"))
    if not modules:
        return None
    probe = ("import sys, numpy, sysconfig; "
             "sys.exit(0 if sysconfig.get_config_var('EXT_SUFFIX') in "
             "sys.argv[1] else 1)")
    for python in (config.python_executable, "/usr/bin/python3"):
        try:
            if subprocess.run([python, "-c", probe, modules[0]],
                              capture_output=True).returncode == 0:
                return python
        except OSError:
            pass
    return None

_mtrt_python = _python_with_numpy()
if _mtrt_python:
    config.available_features.add("mtrt-python")
    config.substitutions.append(("%mtrt_python", _mtrt_python))
    config.environment["PYTHONPATH"] = os.path.join(config.megatron_obj_root,
                                                    "python")

# megatron-compile compiles fused kernels with nvrtc (the CUDA toolkit, no
# GPU needed); tests of the kernels' bundles say "REQUIRES: nvrtc".
if config.megatron_have_nvrtc:
    config.available_features.add("nvrtc")
# The suite's fused-kernel compilations share one cache in the build tree
# (lib/Target/Bundle/KernelCache.h), not the user's.
config.environment["MEGATRON_KERNEL_CACHE"] = os.path.join(
    config.megatron_obj_root, "test", "kernel-cache")

if config.mtrt_cuda_enabled:
    config.available_features.add("mtrt-cuda")
    # cuda-device: a GPU is visible (tests that train on it); without one
    # they report as unsupported, missing this feature.
    _check = os.path.join(config.megatron_tools_dir, "mtrt-cuda-tests")
    if os.path.exists(_check) and subprocess.run(
            [_check, "--mtrt-device-check"],
            capture_output=True).returncode == 0:
        config.available_features.add("cuda-device")

llvm_config.with_system_environment(["HOME", "TMPDIR"])
llvm_config.use_default_substitutions()
tool_dirs = [config.megatron_tools_dir, config.llvm_tools_dir]
tools = ["megatron-compile", "megatron-opt", "megatron-translate",
         "megatron-bundle-schema",
         "mtrt-info", "mtrt-api-c-test", "mtrt-session-c-test",
         "mtrt-status-c-test", "mtrt-train-tiny", "not",
         "split-file",
         "mtrt-run", "megatron-train", "megatron-preprocess",
         "megatron-checkpoint"]
# The NCCL communicator's launch check (built with the CUDA backend and
# nccl.h); its --rendezvous-only mode needs no GPU.
if os.path.exists(os.path.join(config.megatron_tools_dir, "mtrt-nccl-check")):
    config.available_features.add("mtrt-nccl")
    tools.append("mtrt-nccl-check")
llvm_config.add_tool_substitutions(tools, tool_dirs)
