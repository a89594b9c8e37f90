"""alloctrace's startup hook (see alloctrace_hook.py), then any sitecustomize it shadows."""
import os as _os
import sys as _sys

try:
    import alloctrace_hook as _hook

    _hook.install()
except Exception as _e:  # never break the program
    _sys.stderr.write(f"alloctrace: startup hook failed: {_e}\n")


def _chain():
    import importlib.machinery
    import importlib.util

    here = _os.path.dirname(_os.path.abspath(__file__))
    rest = [p for p in _sys.path if _os.path.abspath(p or ".") != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)


_chain()
