#!/usr/bin/env python3
"""The SASS of every cached FlexTile kernel (.ftk, codegen/CompileCache.cpp) under a folder: cuobjdump -sass
of its cubin, one file per kernel in the output folder, headed by the entry's cache key.
Usage: ftk_sass.py CACHE_DIR OUT_DIR (cuobjdump on PATH; the GPU machine has it)."""
import os, shutil, subprocess, sys, tempfile
if len(sys.argv) != 3:
    sys.exit('usage: ftk_sass.py CACHE_DIR OUT_DIR')
if not shutil.which('cuobjdump'):
    sys.exit('ftk_sass.py: cuobjdump is not on PATH (it comes with the CUDA toolkit)')
root, out = sys.argv[1], sys.argv[2]
os.makedirs(out, exist_ok=True)
for dirpath, _, files in os.walk(root):
    for fn in files:
        if not fn.endswith('.ftk'):
            continue
        data = open(os.path.join(dirpath, fn), 'rb').read()
        nl = data.index(b'\n')
        pos = nl + 1
        fields = {}
        while pos < len(data):
            sp = data.index(b' ', pos); nl = data.index(b'\n', sp)
            name = data[pos:sp].decode()
            if name == 'end':
                break
            size = int(data[sp + 1:nl])
            fields[name] = data[nl + 1:nl + 1 + size]
            pos = nl + 1 + size + 1
        name = fields.get('name', b'?').decode()
        cubin = fields.get('cubin', b'')
        if not cubin:
            print(fn, name, 'no cubin'); continue
        with tempfile.NamedTemporaryFile(suffix='.cubin', delete=False) as t:
            t.write(cubin)
        sass = subprocess.run(['cuobjdump', '-sass', t.name], capture_output=True, text=True).stdout
        os.unlink(t.name)
        path = os.path.join(out, name + '_' + fn[:8] + '.sass')
        open(path, 'w').write(fields.get('key', b'').decode() + '\n' + sass)
        print(path, len(sass))
