"""The JAX route through TensorFlow: a rosetta_jax model converted by jax2tf to a SavedModel that TF loads and runs.

It needs both frameworks in one interpreter, which no Rosetta environment has (each framework is locked on its own),
so it has its own: env.py locks and builds it (the union of the tf and jax CPU locks, which pin every shared
distribution alike), export.py converts, saves, reloads and compares inside it. Here rather than in rosetta_jax:
that package may not import tensorflow (its environment has none).
"""
