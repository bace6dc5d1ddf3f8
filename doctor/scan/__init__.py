"""gpudoctor.scan: `gpudoctor scan` and `gpudoctor list`: run the probes in isolated worker
processes of the target interpreter and collect the environment they ran in.

- `runner`: the parent side, `run_scan(options) -> Report`: plans the probes, hands them to
  workers, turns what the workers say (or how they died) into results.
- `supervise`: one worker process as the runner sees it (pipes, deadlines, its stderr tail, ending
  it with everything it started) and the signals that stop a scan.
- `spawn`: starting a worker in the target interpreter (and the console script's early start),
  and ending it with everything it started.
- `worker`: the child side. It runs in the target interpreter, where gpudoctor is not installed:
  it imports the standard library, `protocol`, `torchenv` and gpudoctor.probes, nothing else.
- `protocol`: the line protocol between runner and worker, checked and bounded on the parent side.
- `environment`: the parent's half of the environment report (system, packages, NVML, toolchain);
  `torchenv`: the worker's half (torch, the CUDA libraries it mapped, environment variables).
- `fatbin`: which GPU architectures a CUDA binary carries (read from its ELF and fatbin).
- `modcheck`: `gpudoctor.check_module(model)`, the in-process check of a model's dtypes and
  devices (the one module here that a user's own process imports, with torch).
- `options`: the option types of `gpudoctor scan` (`--device`, `--timeout`, `--level`, ...);
  `command`: the plain scan once the CLI has parsed its options (progress on stderr, the report
  written to every output, the exit code) and `--list-probes`.

May import: the standard library, gpudoctor.probes, gpudoctor.reports (the report model,
redaction), gpudoctor.safetext, gpudoctor.output and typer (`options`, `command`: the conventions
every command shares), and gpudoctor.fleet.launch (a scan records the job it ran in).
Never the CLI layer (gpudoctor.cli, gpudoctor.entry), and never torch at module level.

Imported by: the CLI layer (`scan`, `list`; gpudoctor.entry starts the first worker through
`spawn`), gpudoctor.fleet (a scan per rank or node), gpudoctor.ticket (`gpudoctor run` scans the
probes a failure points at), gpudoctor.lint and the arch-compat probe (`fatbin`), and
gpudoctor.reports.redact (`torchenv`'s allow-list of environment variables). Nothing outside this
package imports `worker`. Importing this package does nothing.
"""
