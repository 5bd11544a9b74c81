"""`python -m runifold_client.cli`: the `runifold` command."""

from runifold_client.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
