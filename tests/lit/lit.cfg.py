# lit configuration for FlexTile's golden tests (IR text after passes; the
# codegen tests add LLVM IR and PTX). ctest runs it as the test `lit`; by hand:
#
#   lit-22 -sv tests/lit --param flextile_bin=<build>/tests/tools
#
# RUN lines use the plain tool names; they are substituted with full paths:
#   flextile-opt  from the build (param flextile_bin, or flextile_opt for the exact file)
#   flextile      the command-line tool (param flextile_cli; tests that need it are skipped without it)
#   FileCheck, not  from LLVM 22 (param llvm_bin, default /usr/lib/llvm-22/bin)
import os
import re
import tempfile

import lit.formats

config.name = "FlexTile"
config.test_format = lit.formats.ShTest(execute_external=True)
config.suffixes = [".ftir"]
config.excludes = ["CMakeLists.txt", "lit.cfg.py"]
config.test_source_root = os.path.dirname(__file__)
config.test_exec_root = lit_config.params.get(
    "exec_root", os.path.join(tempfile.gettempdir(), "flextile-lit-" + str(os.getuid())))

llvm_bin = lit_config.params.get("llvm_bin", "/usr/lib/llvm-22/bin")
flextile_bin = lit_config.params.get("flextile_bin")
tools = {
    "flextile-opt": lit_config.params.get(
        "flextile_opt", os.path.join(flextile_bin, "flextile-opt") if flextile_bin else None),
    "FileCheck": os.path.join(llvm_bin, "FileCheck"),
    "not": os.path.join(llvm_bin, "not"),
}
flextile_cli = lit_config.params.get("flextile_cli")
if flextile_cli and os.access(flextile_cli, os.X_OK):
    config.available_features.add("flextile-cli")
    config.substitutions.append((r"(?<![\w./=-])flextile(?![\w.-])", flextile_cli))
for name, path in tools.items():
    if not path or not os.access(path, os.X_OK):
        lit_config.fatal(f"cannot find '{name}' (got {path!r}); pass --param flextile_bin=<build>/tests/tools "
                         "and --param llvm_bin=<llvm>/bin, or run the suite through ctest -R '^lit$'")
    # A whole word only: not inside a path, a file name or an option such as --check-prefix=not.
    config.substitutions.append((r"(?<![\w./=-])" + re.escape(name) + r"(?![\w.-])", path))

# The tests must not depend on the caller's dump or timing settings.
for var in ("FLEXTILE_DUMP", "FLEXTILE_DUMP_DIR", "FLEXTILE_TIMING", "FLEXTILE_LLVM_SKIP_PASSES",
            "FLEXTILE_LLVM_PIPELINE", "FLEXTILE_LLVM_ARGS", "FLEXTILE_FP_FUSION", "FLEXTILE_WGMMA",
            "FLEXTILE_WGMMA_SMEM_A"):
    config.environment.pop(var, None)

# Feature `ptxas`: NVIDIA's assembler is available (on PATH, else the CUDA
# toolkit's default place, as codegen/Ptxas.cpp looks for it). Tests that need
# it say `REQUIRES: ptxas` and are reported UNSUPPORTED without it.
import shutil

ptxas = shutil.which("ptxas", path=config.environment.get("PATH", os.environ.get("PATH", "")))
if not ptxas and os.access("/usr/local/cuda/bin/ptxas", os.X_OK):
    ptxas = "/usr/local/cuda/bin/ptxas"
if ptxas:
    config.available_features.add("ptxas")
else:
    lit_config.note("ptxas not found (PATH, /usr/local/cuda/bin): the tests that REQUIRE ptxas are UNSUPPORTED")
