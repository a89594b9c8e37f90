"""`python -m alloctrace ARGS...`: the `alloctrace` command, for environments whose scripts
folder is not on PATH."""
import os
import sys

from alloctrace import binary


def main():
    exe = binary()
    if os.name == "nt":
        import subprocess

        sys.exit(subprocess.call([exe, *sys.argv[1:]]))
    os.execv(exe, [exe, *sys.argv[1:]])


if __name__ == "__main__":
    main()
