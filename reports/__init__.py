"""gpudoctor.reports: the report model, its JSON schema, renderers and redaction.

- `model`: the report (`Report`, `ProbeResult`, `SCHEMA_VERSION`) and reading it back from JSON;
  `schema.json`: its JSON schema.
- `render`: the terminal, JSON and Markdown renderers of a scan report; `markdown`: safe Markdown
  for every renderer; `load`: the one reader of report files, for `report`, `diff`, `merge` and
  the fleet's readers; `diff`: what differs between two reports.
- `redact`: what makes a report safe to share (`redact`, `redact_report`, `Redactor`, the facade);
  `redact_spans` is its replacement engine (spans found on the original text, resolved, replaced),
  `redact_secrets` and `redact_machines` its detectors, `redact_forms` the table of credential
  formats, `redact_rules` the name and evidence tables, `redact_stream` the line-by-line redactor.

May import: the standard library, gpudoctor.probes.base (statuses and findings),
gpudoctor.knowledge (a finding's fix), gpudoctor.safetext, and one thing from a capability:
gpudoctor.scan.torchenv's allow-list of environment variables, which redaction must agree with.
Never the CLI layer, never torch.

Imported by: every capability that writes a report (scan, ticket, fleet) and the CLI layer.
"""
