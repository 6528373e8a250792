#!/usr/bin/env python3
"""Fails when an #include crosses the layering of docs/architecture.md.

Each layer may include its own headers and those of the layers listed for it. LLVM headers are
allowed only in codegen/*.cpp; CUDA headers nowhere (the driver is reached through dlopen); libpng's only
in autotune/cli/Pictures.cpp (the tool's pictures; no installed header may pull it).
"""
import pathlib
import re
import sys

ALLOWED = {
    "ir": {"ir"},
    "runtime": {"runtime"},
    "codegen": {"codegen", "ir"},
    "dsl": {"dsl", "ir", "codegen", "runtime"},
    "attention_templates": {"attention_templates", "dsl", "ir", "codegen", "runtime"},
    "autotune": {"autotune", "attention_templates", "dsl", "ir", "codegen", "runtime"},
}
# Of codegen and runtime, dsl/ and attention_templates/ may include only these LLVM- and CUDA-free headers.
PUBLIC = {"codegen/Compiler.h", "codegen/Target.h", "codegen/Ptxas.h", "codegen/CompileCache.h"}
# Headers internal to one layer.
INTERNAL = {"runtime/DriverApi.h": "runtime", "codegen/LowerToLLVMImpl.h": "codegen", "ir/AttrScanner.h": "ir"}
INCLUDE = re.compile(r'^\s*#\s*include\s*[<"]([^>"]+)[>"]', re.M)


def main(root):
    root = pathlib.Path(root)
    problems = []
    for layer, allowed in ALLOWED.items():
        for path in sorted((root / layer).rglob("*")):
            if path.suffix not in (".h", ".cpp", ".def"):
                continue
            for inc in INCLUDE.findall(path.read_text(errors="replace")):
                top = inc.split("/")[0]
                where = f"{path.relative_to(root)} includes <{inc}>"
                if inc.startswith(("llvm/", "llvm-c/")):
                    if not (layer == "codegen" and path.suffix == ".cpp"):
                        problems.append(f"{where}: LLVM headers belong in codegen/*.cpp only")
                elif inc.startswith(("cuda", "cuda.h", "cuda_runtime")) or inc in ("cuda.h", "cudaTypedefs.h"):
                    problems.append(f"{where}: CUDA headers are not used; the driver is loaded with dlopen")
                elif inc in ("png.h", "pngconf.h") or inc.startswith("libpng"):
                    if path.relative_to(root).as_posix() != "autotune/cli/Pictures.cpp":
                        problems.append(f"{where}: libpng belongs in autotune/cli/Pictures.cpp only")
                elif inc in INTERNAL and INTERNAL[inc] != layer:
                    problems.append(f"{where}: {inc} is internal to {INTERNAL[inc]}/")
                elif top in ALLOWED and top not in allowed:
                    problems.append(f"{where}: layer '{layer}' may not depend on '{top}'")
                elif layer in ("dsl", "attention_templates") and top == "codegen" and inc not in PUBLIC:
                    problems.append(f"{where}: only {sorted(PUBLIC)} of codegen/ are public")
    for p in problems:
        print(p)
    print(f"layering: {len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "."))
