"""Tools of the repository (run from its root as ``python -m tools.<name>``);
not part of the torch_axon package and not installed with it."""
