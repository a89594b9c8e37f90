"""`python -m alloctrace ARGS...`: the `alloctrace` command, for environments whose scripts
folder is not on PATH, with the recorder library this package carries (if it does) for
`record`."""
import os
import sys

from alloctrace import _recorder_library, binary


def main():
    if sys.argv[1:2] == ["predict"]:
        from alloctrace.predict import main as predict_main

        sys.exit(predict_main(sys.argv[2:]))
    exe = binary()
    lib = _recorder_library()
    if lib and not os.environ.get("ALLOCTRACE_LIB"):
        os.environ["ALLOCTRACE_LIB"] = lib
    if os.name == "nt":
        import subprocess

        sys.exit(subprocess.call([exe, *sys.argv[1:]]))
    os.execv(exe, [exe, *sys.argv[1:]])


if __name__ == "__main__":
    main()
