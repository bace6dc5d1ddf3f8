"""gpudoctor.explain: `gpudoctor explain ID-or-text` and `gpudoctor list`: name the known failure
in an id, a pasted traceback or a log.

- `textinput`: reads pasted text, a log file or standard input in bounded memory and time.
- `pasted`: undoes what quoting, wrapping and escaping did to text on its way to the user.
- `matcher`: which knowledge-base entries the text matches, ordered (its docstring states the
  rules), the platform the text comes from and the primary CUDA error no entry explains;
  `precedence`: its rules for which match is the answer and which only context.
- `notice`: reads those two beside the entries (platform markers, primary error lines).
- `calibration`: the confidence a verdict states, fitted on labelled texts (`calibration.json`,
  written by tools/calibrate.py).
- `explanation`: the result object and its renderers (text, JSON, Markdown).

May import: the standard library, gpudoctor.knowledge (the entries, their index and predicates),
gpudoctor.reports.markdown, gpudoctor.reports.codepatch (the patch for the user's code, rendered
under the verdict) and gpudoctor.safetext. Never gpudoctor.scan, gpudoctor.ticket,
gpudoctor.fleet, gpudoctor.lint, the CLI layer, or torch: `gpudoctor explain` must start fast.

Imported by: the CLI layer, gpudoctor.ticket (a failed command's output is matched as `explain`
matches it) and gpudoctor.lint.explain (a rule's page is rendered as an explanation). Importing
this package does nothing.
"""
