"""gpudoctor.ticket: from a failed command to a bug ticket: `gpudoctor run`, `gpudoctor report`
and `gpudoctor diff`.

- `runcmd`: runs the user's command with its output passed through unchanged, keeps a bounded
  record of it, forwards signals and says how the command ended; `proctree`: the command's process
  group and tree, ended whole (subreaper, watchdog, the terminal lent when the command reads it).
- `pytrace`: Python tracebacks and torch's C++ stack traces, read out of that output.
- `bundle`: the diagnosis (the known failures in the output, the failing line, a second run that
  localizes an asynchronous CUDA error, the probes the explanation points at) as one ticket:
  built, redacted, and written as a bundle folder; `render`: the ticket as Markdown, terminal
  text and JSON.
- `command`: the three commands' CLI side, registered on the main app by gpudoctor.cli.

May import: the standard library, gpudoctor.explain (matcher, explanation), gpudoctor.knowledge,
gpudoctor.reports, gpudoctor.probes (the registry), gpudoctor.scan.runner (the probes a failure
points at), gpudoctor.patch (the patch for the user's code the traceback names), gpudoctor.output
and gpudoctor.safetext. Never gpudoctor.scan.worker, the CLI layer,
or torch.

Imported by: the CLI layer (gpudoctor.cli registers `command`). Importing this package does
nothing.
"""
