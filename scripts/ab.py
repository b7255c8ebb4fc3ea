"""The seeded A/B from a checkout: ``python scripts/ab.py ARGS`` is ``python -m recipe.ab ARGS`` (recipe/ab/)."""

from recipe.ab.__main__ import main

if __name__ == "__main__":
    main()
