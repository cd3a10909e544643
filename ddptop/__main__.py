"""`python -m ddptop` runs the command line."""

import sys

try:
    from ddptop.cli import main

    if __name__ == "__main__":
        code = main()  # inside the try: a Ctrl-C between the import and main's own try is the same line too
except KeyboardInterrupt:  # Ctrl-C while Python is still loading ddptop: the same one line as later
    print("ddptop: interrupted", file=sys.stderr)
    raise SystemExit(130) from None

if __name__ == "__main__":
    raise SystemExit(code)
