"""`python -m ddptop` runs the command line."""

from ddptop.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
