"""The causal-LM compatibility harness: every causal-LM architecture of the
installed Transformers, shrunk to a tiny random config, run on the CPU and on
axon and compared (forward logits, one training step, greedy ``generate()``;
optionally ``generate()`` compiled with ``backend="axon"``). It writes
docs/COMPATIBILITY.md:

    python -m tools.compat --output docs/COMPATIBILITY.md [--compiled] [--only a,b]

run from the repository root. A tool of the repository, not part of the
torch_axon package. What it does, and the modules' roles: tools/compat/README.md.
"""
