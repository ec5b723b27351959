# lit configuration for the GoogleTest units: every executable in bin/ whose
# name ends in -unit-tests (the compiler's and the runtime's) is run case by case.
import lit.formats

config.name = "megatron-unit"
config.test_format = lit.formats.GoogleTest(".", "-unit-tests")
config.test_source_root = config.megatron_tools_dir
config.test_exec_root = config.megatron_tools_dir
