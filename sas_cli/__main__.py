"""`python -m sas_cli` runs the same as the `sas` console script."""

from sas_cli.commands import main

if __name__ == "__main__":
    main()
