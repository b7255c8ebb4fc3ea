"""Seeded A/B runs of the recipe across speculative modes (:mod:`recipe.ab.runner`), the statistics of what
they logged (:mod:`recipe.ab.stats`) and their report (:mod:`recipe.ab.render`); ``python -m recipe.ab`` runs them."""
