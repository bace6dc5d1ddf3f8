"""gpudoctor.reports: the report model, its JSON schema, renderers and redaction.

- `model`: the report (`Report`, `ProbeResult`, `SCHEMA_VERSION`) and reading it back from JSON;
  `schema.json`: its JSON schema.
- `render`: the terminal, JSON and Markdown renderers of a scan report; `markdown`: safe Markdown
  for every renderer; `load`: reading a report file for `gpudoctor report`; `diff`: what differs
  between two reports.
- `redact`: what makes a report safe to share (`redact`, `redact_report`, `Redactor`); its rule
  tables live in `redact_rules`.

May import: the standard library, gpudoctor.probes.base (statuses and findings),
gpudoctor.knowledge (a finding's fix), gpudoctor.safetext, and one thing from a capability:
gpudoctor.scan.torchenv's allow-list of environment variables, which redaction must agree with.
Never the CLI layer, never torch.

Imported by: every capability that writes a report (scan, ticket, fleet) and the CLI layer.
"""
