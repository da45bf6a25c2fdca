"""Test-wide settings.

Hypothesis draws new random examples on every run by default. In CI (CI=true) the examples are
derandomized, so a run's verdict depends only on the code; run locally without CI to keep exploring.
"""

import os

from hypothesis import settings

settings.register_profile("ci", derandomize=True, database=None, print_blob=True)
# A long search for counterexamples, by hand: pytest --hypothesis-profile=thorough
settings.register_profile("thorough", max_examples=2000, deadline=None)
if os.environ.get("CI"):
    settings.load_profile("ci")
