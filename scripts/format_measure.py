#!/usr/bin/env python3
"""How far a clang-format style is from the code as it is: changed lines and files over the tracked
C++ files of src/ tests/ bench/ fuzz/ (what .clang-format's settings were chosen by, docs/results.md
"Habits in CI").  Usage: scripts/format_measure.py [STYLE [N]]   STYLE: clang-format's --style value
(default "file": .clang-format); N: also list the N files with the most changed lines."""
import subprocess, sys, difflib, os
from concurrent.futures import ThreadPoolExecutor
os.chdir(os.path.join(os.path.dirname(os.path.abspath(__file__)), '..'))
files=[f for f in subprocess.check_output(['git','ls-files','src','tests','bench','fuzz'],text=True).split() if f.endswith(('.cpp','.h','.hpp','.cc'))]
style=sys.argv[1] if len(sys.argv) > 1 else "file"
def one(f):
    out=subprocess.run(['clang-format','--style='+style,'--assume-filename='+f],stdin=open(f),capture_output=True,text=True).stdout
    a=open(f).read().splitlines(); b=out.splitlines()
    n=sum(1 for l in difflib.unified_diff(a,b,lineterm='',n=0) if l[:1] in '+-' and not l.startswith(('+++','---')))
    return f,n
with ThreadPoolExecutor(2) as ex: res=list(ex.map(one,files))
tot=sum(n for _,n in res); nf=sum(1 for _,n in res if n)
print(f'{tot} changed lines in {nf}/{len(files)} files  :: {style}')
if len(sys.argv)>2:
    for f,n in sorted(res,key=lambda x:-x[1])[:int(sys.argv[2])]: print(n,f)
