"""gpudoctor.knowledge: the knowledge base. One TOML file per known failure (`<id>.toml`, shipped
as package data; the files are the data, and tests/test_knowledge_base.py validates every one),
and the code that reads them:

- `kb`: loads and validates entries and derives their recognising patterns.
- `kbcache`: the keyword index, cached per gpudoctor version in the user's cache directory.
- `predicates`: the facts an entry may require of values captured from error text, and the
  values an entry's advice can name (`derived_values`).
- `notices`: what `explain` says when the answer is no entry: the platforms it recognises
  (`notices/<id>.toml`: ROCm, ZLUDA, MPS, XPU, NPU, Gaudi, MUSA, MLU, Tenstorrent) and the
  steps for a CUDA error no entry explains.

The data stays here rather than under gpudoctor.explain because every capability reads it: the
probes emit its ids, `explain` and `run` match text against it, lint's rules cite it and the report
renderers print its fixes. It is a layer below them all.

May import: the standard library (and tomli before Python 3.11), and `gpudoctor.__version__`.
Never a capability, the reports, the CLI layer, or torch.

Imported by: gpudoctor.explain, gpudoctor.ticket, gpudoctor.lint, gpudoctor.reports (render,
diff) and the CLI layer. Importing this package does nothing.
"""
