# find_package(Megatron): the megatron compiler's install tree, for passes,
# dialect plugins and tools built outside the project
# (examples/pass-plugin, docs/PassPipelines.md).
#
# Sets MEGATRON_INCLUDE_DIRS (the compiler's and the mt dialect's headers,
# the TableGen'erated ones among them), MEGATRON_OPT_EXECUTABLE,
# MEGATRON_COMPILE_EXECUTABLE and MEGATRON_TRANSLATE_EXECUTABLE, finds MLIR
# (LLVM 22; give MLIR_DIR if it is not under /usr/lib/llvm-22), and defines
#   megatron_add_pass_plugin(NAME SOURCES...)
# a module library for `megatron-opt --load-pass-plugin`: it compiles against
# the headers only, since megatron-opt exports its MLIR and mt symbols to the
# plugins it loads.
get_filename_component(MEGATRON_PREFIX "${CMAKE_CURRENT_LIST_DIR}/../../.."
                       ABSOLUTE)
set(MEGATRON_INCLUDE_DIRS "${MEGATRON_PREFIX}/include")
set(MEGATRON_OPT_EXECUTABLE "${MEGATRON_PREFIX}/bin/megatron-opt")
set(MEGATRON_COMPILE_EXECUTABLE "${MEGATRON_PREFIX}/bin/megatron-compile")
set(MEGATRON_TRANSLATE_EXECUTABLE "${MEGATRON_PREFIX}/bin/megatron-translate")

include(CMakeFindDependencyMacro)
find_dependency(MLIR CONFIG HINTS /usr/lib/llvm-22/lib/cmake/mlir)

function(megatron_add_pass_plugin name)
  add_library(${name} MODULE ${ARGN})
  target_include_directories(${name} SYSTEM PRIVATE
    ${LLVM_INCLUDE_DIRS} ${MLIR_INCLUDE_DIRS})
  target_include_directories(${name} PRIVATE ${MEGATRON_INCLUDE_DIRS})
  separate_arguments(definitions UNIX_COMMAND "${LLVM_DEFINITIONS}")
  target_compile_options(${name} PRIVATE ${definitions})
  if(NOT LLVM_ENABLE_RTTI)
    target_compile_options(${name} PRIVATE -fno-rtti)
  endif()
  set_target_properties(${name} PROPERTIES CXX_STANDARD 17
                                           CXX_STANDARD_REQUIRED ON)
endfunction()
