"""`python -m explorer ...` is the `explorer` command."""

from explorer.cli import main

if __name__ == "__main__":
    main()
