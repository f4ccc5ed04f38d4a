"""Private implementation of jax_sparse24; the public names are re-exported by the package."""
