"""gpudoctor.patch: the patch for the user's own code, from a failing traceback to a diff of their
file. Where `explain` or `run` has a diagnosis and the traceback's frames name files on this
machine, the project around them is checked with the lint rules that belong to the diagnosed entry
(the entry's `lint` field), and what a rule finds becomes a unified diff of the user's file with
the one command that applies it (`gpudoctor lint --fix --select GPU00N PATH`: lint is the single
place that writes user code; `explain` and `run` never modify a file).

- `locate`: which frames are the user's (not site-packages, the standard library or torch) and
  exist here, and the project they belong to. Standard library only, cheap: it decides whether
  anything else is imported at all.
- `search`: the bounded check (a file limit, a time limit), which findings bear on the failure
  (on a traceback line, in a traceback function or file, or elsewhere for rules whose pattern
  lives away from the failing line), the diff each fix command would write, and the sentence
  that says which line the patch changes and why. The result is a plain JSON-ready dict; its
  shape and renderers live in gpudoctor.reports.codepatch.

May import: the standard library, gpudoctor.knowledge, gpudoctor.lint (the public `preview` and
`rules`, and only once a frame's file exists here: `gpudoctor explain` must start fast) and
gpudoctor.safetext. Never the CLI layer, gpudoctor.explain, gpudoctor.ticket or torch.

Imported by: the CLI layer (`explain`) and gpudoctor.ticket (`run`). Importing this package does
nothing.
"""
