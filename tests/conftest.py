"""Suite-wide settings: property tests are judged on their assertions, never on wall time
(CI machines are slow and shared), so Hypothesis's per-example deadline is off."""

from hypothesis import settings

settings.register_profile("kvsim", deadline=None)
settings.load_profile("kvsim")
